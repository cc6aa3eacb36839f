"""The wall-clock flags under torchrun (--time-budget-min, --snapshot-minutes, --compile-warmup-batches): real
`torchrun --standalone` jobs of dflash-train on the tiny CPU fixtures, 1 target + 2 drafter ranks (gloo).

The training clock is the test hook DFLASH_DEBUG_CLOCK_TICK_S=6: the first drafter rank's clock advances 6 s per
reading (one at the loop's start, one per optimizer step) and its reading is every drafter rank's, so the steps
asserted do not depend on this machine's speed; the other drafter rank never reads a clock of its own."""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch

from trainer_testlib import read_heartbeat, read_metrics, start, torchrun_cmd
from dflash_trainer.loop.checkpoint import find_latest, load_checkpoint
from dflash_trainer.telemetry.writers import read_jsonl
from dflash_trainer.loop.wall_clock import CLOCK_TICK_ENV

TICK = {CLOCK_TICK_ENV: "6"}
BUDGET = ("--epochs", "1000", "--keep-checkpoints", "1", "--hs-queue-depth", "3", "--hs-queue-min-ready", "2",
          "--warmup-ratio", "0.2")


def run_job(tiny, out, log, *extra):
    proc = start(torchrun_cmd(tiny, out, 3, 1, *BUDGET, *extra), log, env=TICK)
    assert proc.wait(timeout=180) == 0, log.read_text()[-4000:]
    return proc, log.read_text()


@pytest.fixture(scope="module")
def budget_job(tiny, tmp_path_factory):
    """1 min of training time with snapshots at 0.2 and 0.5 min and 2 warm-up micro-batches per drafter rank."""
    root = tmp_path_factory.mktemp("budget")
    proc, log = run_job(tiny, root / "out", root / "log", "--time-budget-min", "1", "--snapshot-minutes", "0.2,0.5",
                        "--compile-warmup-batches", "2")
    return {"out": root / "out", "log": log, "pid": proc.pid, "rows": read_metrics(root / "out")}


@pytest.mark.timeout(300)
def test_time_budget_ends_every_rank_at_the_same_step_with_a_checkpoint(budget_job):
    out, log, rows = budget_job["out"], budget_job["log"], budget_job["rows"]
    # readings 6, 12, ..., 60 s end steps 1..10; after step 10 the budget (60 s) is spent
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert [r["train_s"] for r in rows] == [6.0 * k for k in range(1, 11)]
    # step k+1's lr and noise follow the training time after step k (0 for the first step: warmup's floor)
    for r in rows:
        frac = (r["train_s"] - 6.0) / 60
        factor = max(frac / 0.2, 1e-3) if frac < 0.2 else 0.5 * (1 + math.cos(math.pi * (frac - 0.2) / 0.8))
        assert r["lr"] == pytest.approx(3e-3 * factor, rel=1e-9), r["step"]
        assert r["noise"] == pytest.approx(0.05 - 0.04 * frac, rel=1e-9), r["step"]
    # every drafter rank stopped after step 10 (the first one's clock decided); the target ranks stopped feeding
    for rank in (1, 2):
        assert f"[rank {rank} drafter {rank - 1}] drafter done at step 10, 60.0 s of training (the time budget of " \
               "1 min is spent)" in log, log[-3000:]
    assert "[rank 0 target 0] target done" in log
    hb = read_heartbeat(out)
    assert hb["phase"] == "finished" and hb["step"] == 10 and hb["pid"] == budget_job["pid"] and "stopped" not in hb
    assert [hb["ranks"][r]["step"] for r in ("1", "2")] == [10, 10]
    assert all(hb["ranks"][r].get("done") for r in ("0", "1", "2"))
    _, _, state = load_checkpoint(find_latest(str(out)))
    assert state["step"] == 10 and state["scheduler"]["train_s"] == 60.0 and state["num_sequences"] == 80
    assert not os.listdir(out / "ranks")  # a clean exit of every rank


@pytest.mark.timeout(300)
def test_snapshots_under_torchrun_are_checkpoints_at_their_minutes(budget_job):
    out = budget_job["out"]
    snaps = read_jsonl(out / "snapshots.jsonl")
    assert [(s["minutes"], s["step"], s["train_s"]) for s in snaps] == [(0.2, 2, 12.0), (0.5, 5, 30.0), (1.0, 10, 60.0)]
    assert [s["sequences"] for s in snaps] == [16, 40, 80]  # 2 drafter ranks x 4 sequences a step
    assert [os.path.basename(s["checkpoint"]) for s in snaps] == ["0.2min", "0.5min", "1min"]
    rows = {r["step"]: r for r in budget_job["rows"]}
    assert [s["loss"] for s in snaps] == [rows[2]["loss"], rows[5]["loss"], rows[10]["loss"]]
    # --keep-checkpoints 1 pruned step-2 and step-5; the snapshots stay whole, each the weights of its step
    assert sorted(os.listdir(out / "checkpoints")) == ["latest", "step-10"]
    states = [load_checkpoint(s["checkpoint"]) for s in snaps]
    assert [st[2]["step"] for st in states] == [2, 5, 10]
    assert not torch.equal(states[0][0]["fc.weight"], states[1][0]["fc.weight"])
    assert torch.equal(states[2][0]["fc.weight"], load_checkpoint(find_latest(str(out)))[0]["fc.weight"])


@pytest.mark.timeout(300)
def test_compile_warmup_under_torchrun_trains_nothing_and_skips_no_batch(budget_job, tiny, tmp_path):
    log = budget_job["log"]
    for rank in (1, 2):
        assert f"[rank {rank} drafter {rank - 1}] compile warm-up: 2 micro-batches, not trained on" in log
    _, plain_log = run_job(tiny, tmp_path / "out", tmp_path / "log", "--time-budget-min", "1")
    assert "compile warm-up" not in plain_log
    plain = read_metrics(tmp_path / "out")
    assert [r["data_crc"] for r in plain] == [r["data_crc"] for r in budget_job["rows"]]
    assert [r["loss"] for r in plain] == [r["loss"] for r in budget_job["rows"]]  # bit-identical


@pytest.mark.timeout(300)
def test_a_resume_with_a_larger_budget_continues_the_training_time(budget_job, tiny, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(budget_job["out"], out)
    _, log = run_job(tiny, out, tmp_path / "log", "--time-budget-min", "1.5", "--snapshot-minutes", "0.2,0.5")
    assert f"resumed from {out / 'checkpoints' / 'step-10'} at step 10" in log
    assert ("resumed with other training settings than the checkpoint's run: --time-budget-min 1 -> 1.5; "
            "--compile-warmup-batches 2 -> 0") in log
    more = read_metrics(out)[len(budget_job["rows"]):]
    assert [r["step"] for r in more] == [11, 12, 13, 14, 15] and [r["train_s"] for r in more] == [66.0, 72.0, 78.0,
                                                                                                   84.0, 90.0]
    frac = 60.0 / 90  # step 11 trains at the training time the checkpoint had
    assert more[0]["lr"] == pytest.approx(3e-3 * 0.5 * (1 + math.cos(math.pi * (frac - 0.2) / 0.8)), rel=1e-9)
    # the snapshots taken stay (not taken again), the new budget's end is added
    assert [(s["minutes"], s["step"]) for s in read_jsonl(out / "snapshots.jsonl")] == \
        [(0.2, 2), (0.5, 5), (1.0, 10), (1.5, 15)]
