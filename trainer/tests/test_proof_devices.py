"""The proof driver on several devices (two CPU "devices" here): regeneration split over two processes,
dflash-train in its own process, evaluation in a worker process alongside training, and the inline fallback
that finishes what a worker left undone; a second proof on the first one's data. The first proof is run once
(`two_device_proof`) and read by both tests."""

from __future__ import annotations

import json
import os

import pytest

from trainer_testlib import load_benchmark, run_proof_logged


@pytest.fixture(scope="module")
def two_device_proof(tmp_path_factory):
    """A proof with its regeneration over two processes and an evaluation worker: (its --out, log text)."""
    root = tmp_path_factory.mktemp("two-devices")
    out = root / "proof"
    rc, log = run_proof_logged(["--tiny", "--out", str(out), "--time-budget-min", "0.1", "--snapshot-minutes",
                                "0.05", "--device", "cpu", "--regen-devices", "cpu,cpu", "--eval-device", "cpu"],
                               root / "proof.log")
    assert rc == 0, log[-3000:]
    return out, log


@pytest.mark.timeout(600)
def test_split_regeneration_training_and_eval_worker(two_device_proof):
    driver = load_benchmark("proofs.proof_smollm2")
    out, log = two_device_proof
    result = json.load(open(out / "proof.json"))
    data = result["data"]
    assert data["devices"] == ["cpu", "cpu"] and data["complete"]
    # both halves of the prompts were answered, each by its own preparation
    halves = [json.load(open(out / "data" / f"part-{i}" / "stats.json")) for i in (0, 1)]
    assert data["num_rows_written"] == sum(h["num_rows_written"] for h in halves) > 0
    assert abs(halves[0]["num_input_rows"] - halves[1]["num_input_rows"]) <= 1
    linked = sorted(os.listdir(out / "data" / "all"))
    assert len(linked) == data["num_shards"] and all(os.path.exists(out / "data" / "all" / n) for n in linked)
    # dflash-train trained on the regenerated data in its loader's order: each step one micro-batch
    # (--grad-accum 1 in the tiny flags), so the sequences of a snapshot are those of the first `step` batches
    last = result["snapshots"][-1]
    from dflash_trainer.data.batches import BatchLoader, TokenizedDataset
    cfg = result["train_config"]
    assert cfg["data_dir"] == str(out / "data" / "all") and cfg["grad_accum"] == 1
    loader = BatchLoader(TokenizedDataset(cfg["data_dir"], cfg["max_seq_len"]), cfg["seed"], cfg["token_budget"],
                         cfg["max_batch_size"])
    assert last["sequences"] == sum(len(loader.next_batch().lengths) for _ in range(last["step"]))
    # the worker (a separate process, its own log prefix) evaluated the baseline and both snapshots
    assert "worker done" in log
    assert result["baseline"]["lossless"]
    for snap in result["snapshots"]:
        assert snap["eval"]["lossless"] and snap["eval_device"] == "cpu"
        assert os.path.isfile(out / "eval" / f"snapshot-{snap['step']}.json")

    # A worker that died half-way: the inline pass evaluates only what has no result yet.
    proof_eval = load_benchmark("proofs.proof_eval")
    first = result["snapshots"][0]
    os.remove(out / "eval" / f"snapshot-{first['step']}.json")
    baseline_mtime = os.path.getmtime(out / "eval" / "baseline.json")
    kept_mtime = os.path.getmtime(out / "eval" / f"snapshot-{result['snapshots'][1]['step']}.json")
    lines = []
    proof_eval.run_inline(str(out), driver.torch.device("cpu"), None, lines.append)
    redone = json.load(open(out / "eval" / f"snapshot-{first['step']}.json"))
    assert redone["eval"]["split"]["lossless"] and redone["eval"]["split"]["tau"] == first["eval"]["tau"]
    assert redone["eval"]["other_styles"]["tau"] == first["eval_other_styles"]["tau"]
    assert os.path.getmtime(out / "eval" / "baseline.json") == baseline_mtime
    assert os.path.getmtime(out / "eval" / f"snapshot-{result['snapshots'][1]['step']}.json") == kept_mtime
    evaluated = [line for line in lines if not line.startswith("dflash: prompt ")]  # per-prompt progress aside
    assert len(evaluated) == 2 and all(f"({first['step']} steps)" in line for line in evaluated), lines  # both sets
    assert any(line.startswith("dflash: prompt ") for line in lines)  # and the re-evaluation reported its prompts


@pytest.mark.parametrize("flag,value,message", [
    ("--eval-device", "cuda:3", "CUDA devices"),
    ("--regen-devices", "cpu,gpu0", "not a device name"),
])
def test_bad_device_is_refused_before_anything_runs(tmp_path, capsys, flag, value, message):
    driver = load_benchmark("proofs.proof_smollm2")
    with pytest.raises(SystemExit) as exc:
        driver.main(["--tiny", "--out", str(tmp_path / "proof"), "--device", "cpu", flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"device {value.split(',')[-1]!r}" in err and message in err
    assert not os.path.exists(tmp_path / "proof")


@pytest.mark.timeout(600)
def test_second_proof_reuses_the_first_ones_data_and_refuses_another_split(two_device_proof, tmp_path, capsys):
    driver = load_benchmark("proofs.proof_smollm2")
    first = two_device_proof[0]  # its data and split are only read here (the other test re-evaluates into eval/)
    shards = {p: os.path.getmtime(p) for p in (first / "data").rglob("*") if p.is_file()}
    split = {p: open(p).read() for p in first.glob("*prompts*.jsonl")}
    common = ["--tiny", "--target-model", str(first / "tiny_target"), "--prompts", str(first / "tiny_prompts.jsonl"),
              "--data-root", str(first), "--device", "cpu", "--regen-devices", "cpu,cpu", "--time-budget-min", "0.05"]
    second = tmp_path / "second"
    assert driver.main(common + ["--out", str(second), "--warmup-ratio", "0.1"]) == 0
    a, b = (json.load(open(d / "proof.json")) for d in (first, second))
    assert b["data"]["num_rows_written"] == a["data"]["num_rows_written"] and b["data"]["complete"]
    assert b["snapshots"][0]["eval"]["lossless"] and b["train_config"]["warmup_ratio"] == 0.1
    # the baseline does not depend on the drafter: the first proof kept it under the data root, the second
    # (the same target, prompts, settings and device kind) took it from there instead of decoding it again
    assert "baseline_reused" not in a and os.listdir(first / "baseline-cache") == [f"{b['baseline_reused']}.json"]
    for key in ("baseline", "baseline_other_styles", "target_only", "target_only_other_styles"):
        assert b[key] == a[key]
    assert "reused from an earlier proof on this data root" in open(second / "proof.md").read()
    # the first proof's data is untouched: no shard, progress or stats file was rewritten
    assert {p: os.path.getmtime(p) for p in (first / "data").rglob("*") if p.is_file()} == shards
    capsys.readouterr()
    # another held-out split cannot use that data: refused before anything in --data-root changes
    assert driver.main(common + ["--out", str(tmp_path / "third"), "--num-eval", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("proof_smollm2.py: error: --data-root") and "another prompt split" in err
    assert len(err.splitlines()) == 1
    assert {p: open(p).read() for p in first.glob("*prompts*.jsonl")} == split


@pytest.mark.parametrize("value", ["0", "-0.5"])
def test_a_synthesis_temperature_not_above_zero_is_refused_before_anything_runs(tmp_path, capsys, value):
    driver = load_benchmark("proofs.proof_smollm2")
    with pytest.raises(SystemExit) as exc:
        driver.main(["--tiny", "--out", str(tmp_path / "proof"), "--device", "cpu", "--synthesize-prompts", "4",
                     "--synthesize-temperature", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"error: --synthesize-temperature {float(value):g}: pass a temperature above 0" in err
    assert not os.path.exists(tmp_path / "proof")


# A prompt file the proof reads (flag, flags it goes with, the empty file's text and the words refusing it): refused
# before anything runs, since a bad file would otherwise fail only after the regeneration
BAD_FILES = {"system prompts": ("--synthesize-system-prompts", ["--synthesize-prompts", "4"], "\n",
                                "holds no system message"),
             "extra prompts": ("--extra-prompts", [], "", "holds no prompt")}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_prompt_file_is_refused_before_anything_runs(tmp_path, capsys, name):
    flag, extra, text, empty_message = BAD_FILES[name]
    driver = load_benchmark("proofs.proof_smollm2")
    empty = tmp_path / "empty.txt"
    empty.write_text(text)
    for path, message in ((tmp_path / "missing.txt", "no such file"), (empty, empty_message)):
        with pytest.raises(SystemExit) as exc:
            driver.main(["--tiny", "--out", str(tmp_path / "proof"), "--device", "cpu", *extra, flag, str(path)])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"error: {flag}" in err and message in err.lower()  # argparse names the program
        assert not os.path.exists(tmp_path / "proof")
