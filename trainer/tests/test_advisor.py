"""dflash-train --plan (issue 31): the split arithmetic (predict.py) and, on the CPU, the whole mode on the tiny
hybrid target: the real measurement code, a plan.json with every field, nothing else written in the run dir."""

import json
import os
import subprocess
import sys

import pytest

from dflash_trainer.advisor import predict
from dflash_trainer.advisor.layer_timing import at_busy_pace, events_ms, fit_to_forward


def test_a_job_runs_at_its_slower_stage():
    r = predict.split_rate(5, 3, s_target=0.709, s_drafter=0.919)
    assert r["seq_per_s"] == pytest.approx(3 / 0.919) and r["bound_by"] == "drafter"
    r = predict.split_rate(2, 6, s_target=0.709, s_drafter=0.919)
    assert r["seq_per_s"] == pytest.approx(2 / 0.709) and r["bound_by"] == "target"
    # two GPUs per target rank: half the ranks
    assert predict.split_rate(4, 4, 0.709, 0.919, per_rank=2)["target_seq_per_s"] == pytest.approx(2 / 0.709)


def test_shared_gpus_take_turns_and_splits_cover_every_whole_rank():
    assert predict.shared_rate(1, 0.09, 1.135)["seq_per_s"] == pytest.approx(1 / 1.225)
    assert [(s["target_gpus"], s["drafter_gpus"]) for s in predict.splits(8, 0.7, 0.9, per_rank=2)] == \
        [(2, 6), (4, 4), (6, 2)]


def test_verdict_warns_at_15_percent_below_the_best():
    best = {"seq_per_s": 4.0, "target_gpus": 4, "drafter_gpus": 4, "bound_by": "drafter"}
    near = {"seq_per_s": 3.41, "target_gpus": 5, "drafter_gpus": 3, "bound_by": "drafter"}
    far = dict(near, seq_per_s=3.39)
    assert predict.verdict(near, best) is None
    assert "4 + 4 would give 4.00" in predict.verdict(far, best)
    assert predict.verdict(best, best) is None


def test_deepest_queue():
    assert predict.deepest_queue(100, 10, 3) == 3 and predict.deepest_queue(100, 10, 0) == 10


@pytest.mark.slow
def test_plan_on_the_cpu_writes_plan_json(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "dflash_trainer.prep.make_tiny", "--family", "qwen3_5", "--target-dir",
                    str(tmp_path / "t"), "--data-dir", str(tmp_path / "d"), "--num-sequences", "8"], check=True,
                   capture_output=True, env=env)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "dflash_trainer.cli", "--plan", "--target-model", str(tmp_path / "t"),
                        "--data-dir", str(tmp_path / "d"), "--output-dir", str(out), "--target-gpus", "",
                        "--drafter-gpus", "", "--block-size", "8", "--max-anchors", "16", "--num-draft-layers", "1",
                        "--gamma", "4", "--token-budget", "512", "--max-seq-len", "128", "--grad-accum", "2"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads((out / "plan.json").read_text())
    assert os.listdir(out) == ["plan.json"]
    t, d = plan["target"], plan["drafter"]
    assert t["layers"] == 8 and t["layers_per_kind"] == {"linear_attention": 6, "full_attention": 2}
    assert t["s_per_seq"] > 0 and d["s_per_seq"] > 0 and d["sequences_per_micro_batch"] == 4
    assert plan["configured"]["seq_per_s"] == pytest.approx(1 / (t["s_per_seq"] + d["s_per_seq"]))
    assert plan["best"] == plan["configured"] and plan["warning"] is None
    assert "torch fallback" in plan["target_kernels"] and plan["queue"]["deepest"] > 0
    # both stages at the pace of the device kept busy, the forward alone kept beside it
    pace = t["forward_ms_busy"] / t["forward_ms_alone"]
    for kind, n in t["layers_per_kind"].items():
        assert t["per_kind"][kind]["ms_per_layer"] == pytest.approx(t["per_kind"][kind]["ms_per_layer_alone"] * pace)
    assert sum(n * t["per_kind"][k]["ms_per_layer"] for k, n in t["layers_per_kind"].items()) + t["rest_ms"] == \
        pytest.approx(t["s_per_seq"] * 1e3)
    assert d["micro_batch_s"] > 0 and d["micro_batch_s_alone"] > 0 and "busy" in r.stdout
    assert "predicted seq/s" in r.stdout and "verdict:" in r.stdout


@pytest.mark.parametrize("forward_ms, scale, rest", [(90.0, 90.0 / 100.0, 0.0), (104.0, 1.0, 4.0)])
def test_layer_kinds_fitted_to_the_untimed_forward_keep_their_shares(forward_ms, scale, rest):
    """6 DeltaNet layers of 12.5 ms and 2 full-attention layers of 12.5 ms by the events (100 ms): a faster untimed
    forward scales both kinds alike, a slower one leaves them and names the difference the rest."""
    events = {"linear_attention": {"layers": 6, "ms_per_layer": 12.5}, "full_attention": {"layers": 2,
                                                                                          "ms_per_layer": 12.5}}
    fitted, rest_ms, got_scale = fit_to_forward(events, forward_ms)
    assert got_scale == pytest.approx(scale) and rest_ms == pytest.approx(rest)
    assert events_ms(fitted) + rest_ms == pytest.approx(forward_ms)
    assert fitted["linear_attention"]["ms_per_layer_events"] == 12.5
    assert events["linear_attention"]["ms_per_layer"] == 12.5  # the measured figures are not changed in place


def test_kinds_at_the_busy_pace_keep_their_shares_and_sum_to_the_busy_forward():
    """Forwards back to back took 1.05 x the forward alone (a power-capped GPU): every kind and the rest slow alike."""
    fitted, rest_ms, _ = fit_to_forward({"linear_attention": {"layers": 6, "ms_per_layer": 12.0},
                                         "full_attention": {"layers": 2, "ms_per_layer": 11.0}}, 98.0)
    busy, busy_rest = at_busy_pace(fitted, rest_ms, 1.05)
    assert busy_rest == pytest.approx(4.0 * 1.05)  # 98 - (6 x 12 + 2 x 11)
    assert events_ms(busy) + busy_rest == pytest.approx(98.0 * 1.05)
    assert busy["linear_attention"]["ms_per_layer_alone"] == 12.0 and fitted["linear_attention"]["ms_per_layer"] == 12.0
