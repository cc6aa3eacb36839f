"""dflash-eval end to end on the tiny target: checkpoint and export load, report fields, losslessness."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_trainer.loop.checkpoint import save_checkpoint
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.eval.evaluate import check_lossless, main
from dflash_trainer.export.exporter import export_checkpoint
from dflash_trainer.prep.make_tiny import MASK_ID


@pytest.fixture(scope="module")
def drafter_dirs(tiny, tmp_path_factory):
    from transformers import AutoConfig
    root = tmp_path_factory.mktemp("eval")
    torch.manual_seed(1)
    cfg = DrafterConfig.from_target(AutoConfig.from_pretrained(tiny["target"]), num_layers=1,
                                    target_layer_ids=[1, 3, 5], block_size=4, mask_token_id=MASK_ID)
    drafter = DFlashDrafter(cfg)
    out = root / "train_out"
    step_dir = save_checkpoint(str(out), 1, drafter.trainable_state_dict(), cfg.to_dict(), {"step": 1}, keep=1)
    export = root / "export"
    export_checkpoint(step_dir, tiny["target"], str(export), dtype="float32")
    prompts = root / "prompts.jsonl"
    with open(prompts, "w") as f:
        for p in ([5, 17, 33, 2], [300, 301, 302, 303, 300, 301], list(range(60, 80))):
            f.write(json.dumps({"input_ids": p}) + "\n")
    return {"output_dir": str(out), "step_dir": step_dir, "export": str(export), "prompts": str(prompts)}


def run_eval(tiny, drafter_path, prompts, out_path, *extra):
    assert main(["--target-model", tiny["target"], "--drafter", drafter_path, "--prompts", prompts,
                 "--max-new-tokens", "20", "--device", "cpu", "--out", str(out_path), *extra]) == 0
    return json.load(open(out_path))


def test_eval_reports_tau_histogram_and_losslessness(tiny, drafter_dirs, tmp_path, capsys):
    report = run_eval(tiny, drafter_dirs["export"], drafter_dirs["prompts"], tmp_path / "r.json")
    printed = capsys.readouterr().out
    assert "dflash" in printed and "prompt_lookup_n3" in printed and "accept-length histogram" in printed
    assert report["block_size"] == 4 and report["num_prompts"] == 3
    for name in ("dflash", "prompt_lookup_n3"):
        m = report["methods"][name]
        assert m["lossless"], m["mismatches"]
        assert 1.0 <= m["tau"] <= 4
        assert sum(m["accept_length_histogram"].values()) == m["num_steps"]
        assert len(m["slot_accept_rate"]) == 3
        assert m["num_new_tokens"] == sum(len(r) for r in report["references"])
        assert "tau_by_style" not in m  # the rows carry no style


def test_checkpoint_output_dir_and_export_give_the_same_drafts(tiny, drafter_dirs, tmp_path):
    a = run_eval(tiny, drafter_dirs["export"], drafter_dirs["prompts"], tmp_path / "a.json", "--no-baseline")
    b = run_eval(tiny, drafter_dirs["output_dir"], drafter_dirs["prompts"], tmp_path / "b.json", "--no-baseline")
    c = run_eval(tiny, drafter_dirs["step_dir"], drafter_dirs["prompts"], tmp_path / "c.json", "--no-baseline")
    assert a["methods"]["dflash"]["accept_length_histogram"] == b["methods"]["dflash"]["accept_length_histogram"] \
        == c["methods"]["dflash"]["accept_length_histogram"]


def test_bad_drafter_path_is_refused(tiny, drafter_dirs, tmp_path, capsys):
    assert main(["--target-model", tiny["target"], "--drafter", str(tmp_path), "--prompts",
                 drafter_dirs["prompts"], "--device", "cpu"]) == 2
    assert "neither an export dir" in capsys.readouterr().err


def test_check_lossless_names_the_first_difference():
    r = check_lossless([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6, 7]])
    assert not r["lossless"] and r["mismatches"] == [{"prompt": 1, "first_position": 1, "len_output": 2,
                                                      "len_reference": 3}]


def test_plan_free_attention_changes_sdpa_only_for_cuda():
    """Decoding on CUDA turns cuDNN SDPA off for the process (per-shape plan builds); on the CPU nothing changes."""
    from dflash_trainer.eval.decode_attention import use_plan_free_attention
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        use_plan_free_attention("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        use_plan_free_attention(torch.device("cuda", 0))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


def test_workers_give_the_same_report_as_one_process(tiny, drafter_dirs, tmp_path):
    """--workers 2: the prompts decoded in two processes, every figure but the times the same as in one."""
    one = run_eval(tiny, drafter_dirs["export"], drafter_dirs["prompts"], tmp_path / "one.json")
    two = run_eval(tiny, drafter_dirs["export"], drafter_dirs["prompts"], tmp_path / "two.json", "--workers", "2")
    assert two["workers"] == 2 and two["references"] == one["references"]
    timing = ("wall_s", "tokens_per_s")
    for name in ("dflash", "prompt_lookup_n3"):
        a, b = ({k: v for k, v in r["methods"][name].items() if k not in timing} for r in (one, two))
        assert a == b and b["lossless"] and b["num_steps"] > 0
    assert two["target_only"]["num_new_tokens"] == one["target_only"]["num_new_tokens"]


def test_workers_below_one_are_refused(tiny, drafter_dirs, capsys):
    assert main(["--target-model", tiny["target"], "--prompts", drafter_dirs["prompts"], "--device", "cpu",
                 "--workers", "0"]) == 2
    assert capsys.readouterr().err.strip() == "dflash-eval: error: --workers must be at least 1"


def test_tau_by_style_is_the_tau_of_that_styles_prompts_alone(tiny, drafter_dirs, tmp_path, capsys):
    """A prompts file whose rows carry a "style" (the other-styles set's shape): each method reports τ per style,
    equal to τ over only that style's prompts; a row without a style counts in τ but in no style."""
    rows = [([5, 17, 33, 2], "a"), ([300, 301, 302, 303, 300, 301], "b"), (list(range(60, 80)), "a"),
            ([7, 8, 9, 7, 8], None)]
    styled, only_a = tmp_path / "styled.jsonl", tmp_path / "a.jsonl"
    styled.write_text("".join(json.dumps({"input_ids": p, **({"style": st} if st else {})}) + "\n" for p, st in rows))
    only_a.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p, st in rows if st == "a"))
    report = run_eval(tiny, drafter_dirs["export"], str(styled), tmp_path / "styled.json")
    printed = capsys.readouterr().out
    alone = run_eval(tiny, drafter_dirs["export"], str(only_a), tmp_path / "a.json")
    for name in ("dflash", "prompt_lookup_n3"):
        by_style = report["methods"][name]["tau_by_style"]
        assert list(by_style) == ["a", "b"]
        assert by_style["a"] == pytest.approx(alone["methods"][name]["tau"])
        assert f"{name}: τ by style a {by_style['a']:.2f}, b {by_style['b']:.2f}" in printed
        assert sum(report["methods"][name]["prompt_steps"]) == report["methods"][name]["num_steps"]


def test_replay_gives_the_decodes_figures_and_says_it_did_not_check_losslessness(tiny, drafter_dirs, tmp_path,
                                                                                  capsys):
    """dflash-eval --replay: every figure but the times equal the decode's, for DFlash and prompt lookup; the
    table says `replayed` where the decode says whether it was lossless."""
    decoded = run_eval(tiny, drafter_dirs["export"], drafter_dirs["prompts"], tmp_path / "d.json")
    capsys.readouterr()
    replayed = run_eval(tiny, drafter_dirs["export"], drafter_dirs["prompts"], tmp_path / "r.json", "--replay")
    printed = capsys.readouterr().out
    assert replayed["replayed"] and replayed["references"] == decoded["references"]
    same = ("tau", "num_steps", "num_new_tokens", "num_target_forwards", "accept_length_histogram",
            "slot_accept_rate", "prompt_steps", "prompt_accepted", "mean_proposed")
    for name in ("dflash", "prompt_lookup_n3"):
        a, b = decoded["methods"][name], replayed["methods"][name]
        assert {k: a[k] for k in same} == {k: b[k] for k in same}, name
        assert b["replayed"] and b["lossless"] is None and a["lossless"]
    assert "replayed" in printed.splitlines()[2]
