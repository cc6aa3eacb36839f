"""The proof driver's --tiny path end to end on the CPU: regenerate, dflash-train (a subprocess, with a time
budget and a snapshot), export, reload, τ on both held-out sets (the split and the other-styles set); and
--init-drafter: a proof that starts from an earlier proof's export (or checkpoint) — the way a drafter's training can
go on in a later session — and refuses weights of another drafter shape before it writes anything (dflash-train's
own check, run by the driver up front). The hard-label proof is run once and read by both tests."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from trainer_testlib import load_benchmark, read_heartbeat, read_metrics, run_proof_logged
from dflash_trainer.loop import starting_weights, train
from dflash_trainer.prep.heldout import OTHER_STYLES
from dflash_trainer.prep.synthesize import SHIPPED_SYSTEM_PROMPTS


def tiny_proof(root, labels):
    """A proof of 0.1 min with a snapshot at 0.05 min, every step logged: (its --out, report dir, log text)."""
    out, report = root / "proof", root / "report"
    rc, log = run_proof_logged(["--tiny", "--out", str(out), "--time-budget-min", "0.1", "--snapshot-minutes", "0.05",
                                "--device", "cpu", "--log-interval", "1", "--report-dir", str(report)] + labels,
                               root / "proof.log")
    assert rc == 0, log[-3000:]
    return out, report, log


@pytest.fixture(scope="module")
def hard_proof(tmp_path_factory):
    return tiny_proof(tmp_path_factory.mktemp("hard"), [])


@pytest.mark.timeout(600)
# the soft-label proof also trains on prompts the tiny target writes itself (--synthesize-prompts) and decodes
# its evaluation in two processes (--eval-workers), the synthesis steered by the shipped system messages
@pytest.mark.parametrize("labels", [[], ["--use-soft-labels", "--synthesize-prompts", "16", "--eval-workers", "2",
                                         "--synthesize-system-prompts", SHIPPED_SYSTEM_PROMPTS,
                                         "--synthesize-temperature", "0.9"]],
                         ids=["hard", "soft"])
def test_proof_tiny_drives_dflash_train_and_reports(request, tmp_path, labels):
    if labels:  # and on an extra prompt file (--extra-prompts), one of whose rows is an other-styles prompt
        other = json.loads(open(OTHER_STYLES).readline())
        extra = tmp_path / "extra.jsonl"
        extra.write_text("".join(json.dumps(r) + "\n" for r in [
            {"messages": [{"role": "user", "content": "Tell me about the tiny model's favourite colour."}]},
            {"messages": [{"role": "user", "content": "Count from one to five, please."}]}, other]))
        labels = labels + ["--extra-prompts", str(extra)]
    out, report, log = request.getfixturevalue("hard_proof") if not labels else tiny_proof(tmp_path, labels)
    result = json.load(open(report / "proof.json"))
    # the training was dflash-train's, with the driver's flags handed on under their own names
    command = result["train_command"]
    assert command[1:3] == ["-m", "dflash_trainer.cli"] and ("--use-soft-labels" in command) == bool(labels)
    assert "--time-budget-min=0.1" in command and "--snapshot-minutes=0.05" in command
    assert result["train_config"]["use_soft_labels"] == bool(labels) and result["train_config"]["block_size"] == 8
    hb = read_heartbeat(out / "train")
    assert hb["phase"] == "finished" and hb["pid"] != os.getpid()
    assert "the time budget of 0.1 min is spent" in log and f"{'soft' if labels else 'hard'} labels" in log
    # its snapshots at 0.05 min and at the end of the budget, each evaluated from its export
    assert [s["minutes"] for s in result["snapshots"]] == [0.05, 0.1]
    assert result["baseline"]["lossless"] and result["baseline_other_styles"]["lossless"]
    assert result["num_other_styles_prompts"] == 4 and result["baseline_other_styles"]["num_prompts"] == 4
    for snap in result["snapshots"]:
        assert snap["step"] >= 1 and snap["eval"]["lossless"] and snap["train_s"] >= snap["minutes"] * 60
        assert 1.0 <= snap["eval"]["tau"] <= result["block_size"]
        other = snap["eval_other_styles"]  # the same export on the other-styles prompts, through dflash-eval's code
        assert other["lossless"] and other["num_prompts"] == 4 and 1.0 <= other["tau"] <= result["block_size"]
        assert os.path.isfile(os.path.join(snap["export"], "config.json"))
        assert snap["checkpoint"] == str(out / "train" / "snapshots" / f"{snap['minutes']:g}min")
    assert result["snapshots"][-1]["step"] == read_metrics(out / "train")[-1]["step"]
    assert result["curve"] and result["curve"][-1]["step"] == result["snapshots"][-1]["step"]
    table = open(report / "proof.md").read()
    assert "| DFlash | 0.1 |" in table and "prompt lookup" in table and "trained by dflash-train" in table
    # both τ side by side in the table: the split's, then the other styles'
    assert "| τ | τ other styles |" in table
    last = result["snapshots"][-1]
    assert f"| {last['eval']['tau']:.2f} | {last['eval_other_styles']['tau']:.2f} |" in table
    # τ per style of the other-styles set (its rows carry one), for the drafter and prompt lookup
    styles = list(dict.fromkeys(json.loads(line)["style"] for line in open(result["other_styles"]).readlines()[:4]))
    assert list(last["eval_other_styles"]["tau_by_style"]) == styles
    assert list(result["baseline_other_styles"]["tau_by_style"]) == styles and "tau_by_style" not in last["eval"]
    assert f"τ by style: {styles[0]} {last['eval_other_styles']['tau_by_style'][styles[0]]:.2f}" in table
    # the other-styles set was kept out of the training data (the check ran: nothing of it in the tiny chats)
    assert result["data"]["bad"].get("held_out", 0) == 0 and result["other_styles"].endswith("other_styles.jsonl")
    assert ("decoding in 2 worker processes on cpu" in log) == bool(labels)
    synth = result["data"].get("synthesized")
    if not labels:
        assert synth is None and result["train_command"][result["train_command"].index("--data-dir") + 1] == \
            str(out / "data")
        return
    # the synthesized prompts: answered like the others, trained on beside them (one folder of links to all)
    assert 1 <= synth["prompts"]["kept"] == synth["data"]["num_input_rows"] <= 16
    # steered by the shipped system messages: the template's own prefix and each of the eight took turns
    assert len(synth["prompts"]["kept_by_system_prompt"]) == 9
    # sampled at --synthesize-temperature (the synthesis records its settings beside its file)
    assert json.load(open(out / "data" / "synth-prompts.jsonl.stats.json"))["settings"]["temperature"] == 0.9
    # the extra prompts: the two answered, the other-styles prompt refused as held out
    extra = result["data"]["extra"]
    assert extra["num_rows_written"] == 2 and extra["bad"] == {"held_out": 1}
    settings = json.load(open(out / "data" / "extra" / "progress.json"))["settings"]
    assert [path for path, _ in settings["held_out"]] == [str(out / "eval_prompts.jsonl")]  # the split's too
    data_dir = out / "data" / "with-synth-extra"
    assert result["train_command"][result["train_command"].index("--data-dir") + 1] == str(data_dir)
    shards = sorted(os.listdir(data_dir))
    every = [*(out / "data").glob("*.parquet"), *(out / "data" / "synth").glob("*.parquet"),
             *(out / "data" / "extra").glob("*.parquet")]
    assert {os.path.realpath(data_dir / n) for n in shards} == {os.path.realpath(p) for p in every}
    written = result["data"]["num_rows_written"] + synth["data"]["num_rows_written"] + extra["num_rows_written"]
    assert f"{written} sequences" in log
    held = {json.loads(line)["messages"][0]["content"] for line in open(out / "eval_prompts.jsonl")}
    synthesized = {json.loads(line)["messages"][0]["content"] for line in open(out / "data" / "synth-prompts.jsonl")}
    assert synthesized and not held & synthesized


@pytest.mark.timeout(600)
def test_warm_start_continues_from_the_export_and_refuses_another_shape(hard_proof, tmp_path, capsys):
    driver = load_benchmark("proofs.proof_smollm2")
    first = hard_proof[0]  # its snapshots' exports and checkpoints are only read here
    a = json.load(open(first / "proof.json"))
    export = a["snapshots"][-1]["export"]

    # the export's weights (bf16 there) and the checkpoint's (fp32) are the same drafter
    common = ["--tiny", "--target-model", str(first / "tiny_target"), "--prompts", str(first / "tiny_prompts.jsonl"),
              "--device", "cpu", "--time-budget-min", "0.05", "--log-interval", "1"]
    _, _, cfg = driver.parse_args(common + ["--out", str(first)])
    drafter_cfg = train.drafter_config_for(dataclasses.replace(cfg, mask_token_id=511))[2]
    from_export = starting_weights.initial_weights(export, drafter_cfg)
    from_ckpt = starting_weights.initial_weights(a["snapshots"][-1]["checkpoint"], drafter_cfg)
    exported = load_file(os.path.join(export, "model.safetensors"))
    assert set(from_export) == set(exported) == set(from_ckpt)
    for k, v in exported.items():
        assert torch.equal(from_export[k], v.float())
        assert torch.equal(from_ckpt[k].to(torch.bfloat16), v)

    second = tmp_path / "second"
    assert driver.main(common + ["--out", str(second), "--init-drafter", export]) == 0
    b = json.load(open(second / "proof.json"))
    assert b["init_drafter"] == export and f"--init-drafter={export}" in b["train_command"]
    # warm: its first step's loss is below the cold start's, on the same first batch
    assert b["curve"][0]["step"] == a["curve"][0]["step"] == 1
    assert b["curve"][0]["loss"] < 0.9 * a["curve"][0]["loss"]
    assert b["snapshots"][0]["eval"]["lossless"]

    capsys.readouterr()
    third = tmp_path / "third"
    assert driver.main(common + ["--out", str(third), "--init-drafter", export, "--block-size", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is another drafter (block_size 8 there, 4 here)" in err
    assert os.listdir(third) == []  # no split, data or training
    assert driver.main(common + ["--out", str(third), "--init-drafter", str(tmp_path)]) == 2
    assert "is neither an export dir" in capsys.readouterr().err


def test_eval_replay_gives_a_snapshot_the_decodes_figures(hard_proof, tmp_path):
    """The proof's --eval-replay (settings "replay"): a snapshot evaluated by replaying the baseline's references
    gets the decode's figures on both sets, marked replayed, and the report says so instead of `yes`."""
    import shutil
    out = tmp_path / "proof"
    shutil.copytree(hard_proof[0], out, symlinks=True)
    proof_eval, proof_report = load_benchmark("proofs.proof_eval"), load_benchmark("proofs.proof_report")
    settings = json.load(open(out / "eval" / "settings.json"))
    proof_eval.write_settings(str(out), dict(settings, replay=True))
    snap = proof_eval.listed_snapshots(str(out))[-1]
    decoded = proof_eval.snapshot_result(str(out), snap["step"])["eval"]
    ev = proof_eval.Evaluator(str(out), torch.device("cpu"), lambda msg: None)
    try:
        ev.snapshot(snap)
    finally:
        ev.close()
    replayed = proof_eval.snapshot_result(str(out), snap["step"])["eval"]
    figures = ("tau", "num_steps", "accept_length_histogram", "prompt_steps", "prompt_accepted", "tau_by_style")
    for name in ("split", "other_styles"):
        assert {k: decoded[name].get(k) for k in figures} == {k: replayed[name].get(k) for k in figures}, name
        assert replayed[name]["replayed"] and replayed[name]["lossless"] is None and decoded[name]["lossless"]
    assert proof_report._lossless(list(replayed.values())) == "replayed"
    assert proof_report._lossless(list(decoded.values())) == "yes"


def test_eval_replay_replays_the_baselines_prompt_lookup_and_a_decoding_proof_does_not_reuse_it(hard_proof, tmp_path):
    """--eval-replay's baseline: the references decoded, prompt lookup replayed over them with the decode's figures
    (its drafts come from the context alone). Kept in the cache, that baseline is not reused by a proof that decodes:
    it decodes prompt lookup again and keeps the decoded baseline, which a replaying proof then reuses."""
    import shutil
    out = tmp_path / "proof"
    shutil.copytree(hard_proof[0], out, symlinks=True)
    proof_eval = load_benchmark("proofs.proof_eval")
    settings = json.load(open(out / "eval" / "settings.json"))
    cache = tmp_path / "cache"
    decoded = json.load(open(out / "eval" / "baseline.json"))["sets"]

    def baseline(replay):
        os.remove(out / "eval" / "baseline.json")
        proof_eval.write_settings(str(out), dict(settings, replay=replay, baseline_cache=str(cache)))
        logged = []
        ev = proof_eval.Evaluator(str(out), torch.device("cpu"), logged.append)
        try:
            ev.baseline()
        finally:
            ev.close()
        return json.load(open(out / "eval" / "baseline.json")), "\n".join(logged)

    replayed, log = baseline(True)
    figures = ("tau", "num_steps", "accept_length_histogram", "prompt_steps", "prompt_accepted", "tau_by_style")
    for name in ("split", "other_styles"):
        got, want = replayed["sets"][name], decoded[name]
        assert got["references"] == want["references"] and "target only" in log
        assert {k: got["prompt_lookup"].get(k) for k in figures} == {k: want["prompt_lookup"].get(k) for k in figures}
        assert got["prompt_lookup"]["replayed"] and want["prompt_lookup"]["lossless"]
    again, log = baseline(False)  # a decoding proof: the cached, replayed prompt lookup is not taken
    assert "was replayed, and this proof decodes" in log and "reused" not in again
    assert all(s["prompt_lookup"]["lossless"] for s in again["sets"].values())
    reused, log = baseline(True)  # the decoded baseline, now in the cache, serves a replaying proof
    assert reused["reused"] and "nothing decoded" in log and "was replayed" not in log
