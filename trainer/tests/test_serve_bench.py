"""serve_bench on the tiny model, CPU, for function only: the report's shape and losslessness, never a time."""

import json
import re

import pytest
import torch
from trainer_testlib import load_benchmark

from dflash_trainer.loop.checkpoint import save_checkpoint
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.export.exporter import export_checkpoint


@pytest.fixture(scope="module")
def export_and_prompts(tiny, tmp_path_factory):
    from transformers import AutoConfig
    from dflash_trainer.prep.make_tiny import make_sequences
    root = tmp_path_factory.mktemp("serve")
    cfg = DrafterConfig.from_target(AutoConfig.from_pretrained(tiny["target"]), 1, [1, 3, 5], block_size=4,
                                    mask_token_id=511)
    torch.manual_seed(0)
    save_checkpoint(str(root / "out"), 1, DFlashDrafter(cfg).trainable_state_dict(), cfg.to_dict(), {"step": 1},
                    keep=1)
    export_checkpoint(str(root / "out"), tiny["target"], str(root / "export"), dtype="float32")
    with open(root / "prompts.jsonl", "w") as f:
        for ids, mask in make_sequences(3, seed=99):
            f.write(json.dumps({"input_ids": ids[:mask.index(1) + 2]}) + "\n")
    return str(root / "export"), str(root / "prompts.jsonl"), root


def test_serve_bench_cpu_function(tiny, export_and_prompts, capsys):
    export, prompts, root = export_and_prompts
    bench = load_benchmark("benchmarks.serve_bench")
    rc = bench.main(["--target-model", tiny["target"], "--drafter", export, "--prompts", prompts, "--num-prompts",
                     "3", "--max-new-tokens", "12", "--device", "cpu", "--dtype", "float32", "--out",
                     str(root / "report.json")])
    assert rc == 0
    report = json.load(open(root / "report.json"))
    assert report["num_prompts"] == 3 and report["block_size"] == 4
    assert report["lossless"] and report["divergences"] == [] and report["num_identical_prompts"] == 3
    assert 1 <= report["tau"] <= 4
    assert report["plain"]["new_tokens"] == report["speculative"]["num_new_tokens"]
    assert report["plain"]["cache"] in ("static", "dynamic")
    assert [row["phase"] for row in report["overhead"]] == ["drafter", "verify", "bookkeeping"]
    assert abs(sum(row["share"] for row in report["overhead"]) - 1) < 1e-6
    assert all(row["ms_per_step"] >= 0 for row in report["overhead"])
    assert report["settings"]["compile"] is False and report["settings"]["cuda_graphs"] is False
    assert report["compiled_graphs"] == {"warmup": 0, "timed": 0}
    assert report["warmup"] == {"prompts": 1, "held_apart": False}  # the file has no prompt beyond the 3 measured
    out = capsys.readouterr().out
    for label in ("plain", "speculative", "speedup", "tau", "lossless", "drafter", "verify", "bookkeeping"):
        assert label in out, label


def test_repeats_take_turns_and_the_headline_is_the_median_pair(tiny, export_and_prompts, capsys):
    export, prompts, root = export_and_prompts
    bench = load_benchmark("benchmarks.serve_bench")
    rc = bench.main(["--target-model", tiny["target"], "--drafter", export, "--prompts", prompts, "--num-prompts",
                     "2", "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32", "--repeats", "3",
                     "--warmup", "1", "--out", str(root / "repeats.json")])
    assert rc == 0
    report = json.load(open(root / "repeats.json"))
    assert len(report["repeats"]) == 3 and report["repeats_same_tokens"] is True
    assert report["warmup"] == {"prompts": 1, "held_apart": True}  # the third prompt of the file
    speedups = sorted(f["speedup"] for f in report["repeats"])
    assert report["speedup"] == speedups[1]
    middle = next(f for f in report["repeats"] if f["speedup"] == speedups[1])
    assert report["plain"]["tokens_per_s"] == middle["plain_tokens_per_s"]
    assert report["speculative"]["tokens_per_s"] == middle["speculative_tokens_per_s"]
    assert "median of 3 pairs of timed passes" in capsys.readouterr().out
    assert bench.median_pair([{"speedup": 2.0}, {"speedup": 1.0}, {"speedup": 3.0}, {"speedup": 2.5}]) == \
        {"speedup": 2.0}
    assert bench.main(["--target-model", tiny["target"], "--drafter", export, "--prompts", prompts,
                       "--device", "cpu", "--repeats", "0"]) == 2
    assert "--repeats >= 1" in capsys.readouterr().err


def test_compiled_layers_make_their_graphs_in_the_warmup_and_none_in_the_timed_passes(export_and_prompts, tmp_path,
                                                                                      capsys):
    """--compile: the target's decoder layers (one graph each: the cache's layer index) and the drafter's layers,
    through dynamo's eager backend (its graphs and guards, no code generation: a function check on the CPU), on a
    2-layer target (dynamo traces ~6 graphs a layer, 0.5 s each here)."""
    from transformers import AutoConfig
    from dflash_trainer.prep.make_tiny import write_target
    _, prompts, _ = export_and_prompts
    target, out = str(tmp_path / "target"), str(tmp_path / "out")
    write_target(target, seed=0, num_layers=2)
    cfg = DrafterConfig.from_target(AutoConfig.from_pretrained(target), 1, [0], block_size=4, mask_token_id=511)
    torch.manual_seed(0)
    save_checkpoint(out, 1, DFlashDrafter(cfg).trainable_state_dict(), cfg.to_dict(), {"step": 1}, keep=1)
    export_checkpoint(out, target, str(tmp_path / "export"), dtype="float32")
    bench = load_benchmark("benchmarks.serve_bench")
    rc = bench.main(["--target-model", target, "--drafter", str(tmp_path / "export"), "--prompts", prompts,
                     "--num-prompts", "2", "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32",
                     "--warmup", "1", "--compile", "--compile-backend", "eager", "--out", str(tmp_path / "r.json")])
    assert rc == 0
    report = json.load(open(tmp_path / "r.json"))
    assert report["settings"]["compile"] is True and report["lossless"] and report["num_identical_prompts"] == 2
    assert report["compiled_graphs"]["warmup"] >= 2 and report["compiled_graphs"]["timed"] == 0
    out = capsys.readouterr().out
    assert f"compiled graphs: {report['compiled_graphs']['warmup']} in the warm-up, 0 in the timed passes\n" in \
        out + "\n"
    # printed as soon as the warm-up ends, before the timed passes: a long compile shows how far a run got
    progress = re.search(r"warm-up of 1 prompts took [0-9.]+ s \((\d+) graphs compiled, 0 drafter CUDA graphs "
                         r"captured\); timing 1 pair", out)
    assert progress and int(progress[1]) == report["compiled_graphs"]["warmup"]
    assert out.index(progress[0]) < out.index("speedup ")


def test_warmup_prompts_are_held_apart_from_the_measured_ones_where_the_file_has_them():
    bench = load_benchmark("benchmarks.serve_bench")
    assert bench.split_warmup(list("abcdef"), 3, 2) == (list("abc"), list("de"), True)
    assert bench.split_warmup(list("abcd"), 3, 2) == (list("abc"), list("ab"), False)
    assert bench.split_warmup(list("abc"), 3, 0) == (list("abc"), [], True)


def test_serve_bench_reports_a_divergence_with_its_margin(tiny):
    """A divergence from plain decoding is found at its first position, with the target's logit margin."""
    from transformers import AutoModelForCausalLM
    bench = load_benchmark("benchmarks.serve_bench")
    model = AutoModelForCausalLM.from_pretrained(tiny["target"], dtype=torch.float32).eval()
    prompt = [5, 6, 7, 8]
    plain = bench.plain_decode(model, [prompt], 6, set(), static_cache=False)[0][0].tokens
    other = plain[:3] + [(plain[3] + 1) % 500] + plain[4:]
    [d] = bench.divergences(model, [prompt], [other], [plain], torch.device("cpu"))
    assert d["position"] == 3 and d["plain_token"] == plain[3] and d["speculative_token"] == other[3]
    assert d["margin"] > 0  # plain's token is the target's argmax there
    assert bench.divergences(model, [prompt], [plain], [plain], torch.device("cpu")) == []


def test_serve_bench_refuses_missing_cuda_in_one_line(tiny, export_and_prompts, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    export, prompts, _ = export_and_prompts
    bench = load_benchmark("benchmarks.serve_bench")
    assert bench.main(["--target-model", tiny["target"], "--drafter", export, "--prompts", prompts]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cpu" in err[0]


@pytest.mark.parametrize("extra", [("--device", "cpu"), ("--device", "cuda", "--compile")])
def test_cuda_graphs_are_refused_off_cuda_and_with_compile_in_one_line(tiny, export_and_prompts, capsys, extra):
    export, prompts, _ = export_and_prompts
    bench = load_benchmark("benchmarks.serve_bench")
    assert bench.main(["--target-model", tiny["target"], "--drafter", export, "--prompts", prompts,
                       "--cuda-graphs", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cuda-graphs captures the eager drafter on CUDA" in err[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_serve_losslessly_and_count_their_captures(tiny, export_and_prompts, tmp_path, capsys):
    export, prompts, _ = export_and_prompts
    bench = load_benchmark("benchmarks.serve_bench")
    assert bench.main(["--target-model", tiny["target"], "--drafter", export, "--prompts", prompts,
                       "--num-prompts", "2", "--max-new-tokens", "16", "--dtype", "float32", "--warmup", "1",
                       "--cuda-graphs", "--out", str(tmp_path / "r.json")]) == 0
    report = json.load(open(tmp_path / "r.json"))
    assert report["settings"]["cuda_graphs"] is True and report["lossless"]
    g = report["drafter_cuda_graphs"]
    assert g["warmup"] >= 1 and g["warmup"] + g["timed"] >= 1
    assert f"drafter CUDA graphs: {g['warmup']} captured in the warm-up" in capsys.readouterr().out
