"""Training by wall clock (--time-budget-min, --snapshot-minutes, --compile-warmup-batches, --init-drafter) in
train.run, on the tiny CPU target. The clock is a stand-in that advances 6 s per reading (the loop reads it once
per optimizer step), so what is asserted does not depend on this machine's speed."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import threading

import pytest
import torch

from trainer_testlib import read_metrics, train_cmd
from dflash_trainer.loop import train
from dflash_trainer.loop.checkpoint import find_latest, load_checkpoint
from dflash_trainer.cli import config_from_args
from dflash_trainer.config import validate_paths
from dflash_trainer.export.exporter import export_checkpoint, load_exported_drafter
from dflash_trainer.telemetry.heartbeat import Heartbeat


def _run(tiny, out, *extra, clock_step=6.0):
    argv = train_cmd(tiny, out, "--epochs", "1000", "--keep-checkpoints", "1", *extra)[3:]
    cfg = config_from_args(argv)
    validate_paths(cfg)
    ticks = itertools.count(0.0, clock_step)
    return cfg, train.run(cfg, Heartbeat(cfg.run_dir, 10.0), threading.Event(), clock=lambda: next(ticks))


def _snapshots(run_dir):
    with open(os.path.join(run_dir, "snapshots.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.timeout(300)
def test_lr_and_noise_follow_training_time_and_the_run_stops_at_the_budget(tiny, tmp_path):
    out = tmp_path / "out"
    cfg, status = _run(tiny, out, "--time-budget-min", "1", "--snapshot-minutes", "0.2,0.5", "--warmup-ratio", "0.2",
                       "--noise-start", "0.05", "--noise-end", "0.01")
    assert status == 0
    rows = read_metrics(out)
    # readings 6, 12, ..., 54 s start steps 1..9; at the 60 s reading the budget is spent: no 10th step
    assert [r["step"] for r in rows] == list(range(1, 10))
    assert [r["train_s"] for r in rows] == [6.0 * k for k in range(1, 10)]
    for r in rows:
        frac = r["train_s"] / 60
        factor = frac / 0.2 if frac < 0.2 else 0.5 * (1 + math.cos(math.pi * (frac - 0.2) / 0.8))
        assert r["lr"] == pytest.approx(3e-3 * factor, rel=1e-9), r["step"]
        assert r["noise"] == pytest.approx(0.05 - 0.04 * frac, rel=1e-9), r["step"]
    assert rows[1]["lr"] == pytest.approx(3e-3) and rows[0]["lr"] < rows[1]["lr"] > rows[-1]["lr"] > 0
    _, _, state = load_checkpoint(find_latest(str(out)))
    assert state["step"] == 9 and state["scheduler"]["train_s"] == 60.0 and state["num_sequences"] > 0

    # snapshots: 0.2 min (12 s) after step 1, 0.5 min (30 s) after step 4, the budget's end after step 9
    snaps = _snapshots(out)
    assert [(s["minutes"], s["step"], s["train_s"]) for s in snaps] == [(0.2, 1, 12.0), (0.5, 4, 30.0), (1.0, 9, 60.0)]
    assert [os.path.basename(s["checkpoint"]) for s in snaps] == ["0.2min", "0.5min", "1min"]
    # --keep-checkpoints 1 pruned step-1 and step-4: the snapshots stay whole
    assert sorted(os.listdir(out / "checkpoints")) == ["latest", "step-9"]
    weights = [load_checkpoint(s["checkpoint"])[0]["fc.weight"] for s in snaps]
    assert not torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])
    assert torch.equal(weights[2], load_checkpoint(find_latest(str(out)))[0]["fc.weight"])
    # each snapshot is evaluable: it exports and reloads as the drafter it holds
    export = tmp_path / "export"
    export_checkpoint(snaps[0]["checkpoint"], tiny["target"], str(export), dtype="float32")
    drafter = load_exported_drafter(str(export), tiny["target"])
    assert torch.equal(drafter.fc.weight.detach(), weights[0])
    assert rows[0]["sequences"] < snaps[1]["sequences"] < snaps[2]["sequences"] == state["num_sequences"]

    # a resume with a larger budget continues the training time (60 s): the schedule goes on from there, the
    # snapshots taken stay, the new budget's end is added
    _, status = _run(tiny, out, "--time-budget-min", "1.5", "--snapshot-minutes", "0.2,0.5", "--warmup-ratio", "0.2")
    assert status == 0
    more = read_metrics(out)[len(rows):]
    assert [r["step"] for r in more] == [10, 11, 12, 13] and [r["train_s"] for r in more] == [66.0, 72.0, 78.0, 84.0]
    frac = 66.0 / 90
    assert more[0]["lr"] == pytest.approx(3e-3 * 0.5 * (1 + math.cos(math.pi * (frac - 0.2) / 0.8)), rel=1e-9)
    assert [(s["minutes"], s["step"]) for s in _snapshots(out)][3:] == [(1.5, 13)]


@pytest.mark.timeout(300)
def test_wsd_holds_the_peak_then_decays_linearly_by_time_and_by_steps(tiny, tmp_path):
    """--lr-schedule wsd: after warmup the peak lr is held, then it falls linearly to 0 over the last
    --lr-decay-ratio of the rest of the run, by training time and by steps alike."""
    out = tmp_path / "time"
    _, status = _run(tiny, out, "--time-budget-min", "1", "--warmup-ratio", "0.2", "--lr-schedule", "wsd",
                     "--lr-decay-ratio", "0.25")
    assert status == 0
    rows = read_metrics(out)
    decay_from = 0.2 + 0.8 * 0.75          # the decay spans the last quarter of the 48 s after warmup: from 48 s
    for r in rows:
        frac = r["train_s"] / 60
        factor = frac / 0.2 if frac < 0.2 else min(1.0, (1 - frac) / (1 - decay_from))
        assert r["lr"] == pytest.approx(3e-3 * factor, rel=1e-9), r["step"]
    assert [r["lr"] == pytest.approx(3e-3) for r in rows] == [False] + [True] * 7 + [False]   # 12..48 s held
    out = tmp_path / "steps"
    _, status = _run(tiny, out, "--max-steps", "10", "--warmup-ratio", "0.1", "--lr-schedule", "wsd",
                     "--lr-decay-ratio", "0.5")
    assert status == 0
    lrs = [r["lr"] / 3e-3 for r in read_metrics(out)]
    # warmup 1 step; steps 1..9 after it: progress (s-1)/9, held while <= 0.5, then (1 - progress) / 0.5
    expected = [1.0] + [min(1.0, (1 - (s - 1) / 9) / 0.5) for s in range(1, 10)]
    assert lrs == pytest.approx(expected, rel=1e-9)


@pytest.mark.timeout(300)
def test_compile_warmup_trains_nothing_and_skips_no_batch(tiny, tmp_path):
    _run(tiny, tmp_path / "plain", "--max-steps", "3")
    _run(tiny, tmp_path / "warm", "--max-steps", "3", "--compile-warmup-batches", "2")
    plain, warm = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "warm")
    assert [r["data_crc"] for r in warm] == [r["data_crc"] for r in plain]
    assert [r["loss"] for r in warm] == [r["loss"] for r in plain]  # bit-identical


@pytest.mark.timeout(300)
def test_init_drafter_starts_from_the_weights_and_refuses_another_shape(tiny, tmp_path):
    _run(tiny, tmp_path / "first", "--max-steps", "20")
    first = read_metrics(tmp_path / "first")
    ckpt = find_latest(str(tmp_path / "first"))
    _run(tiny, tmp_path / "warm", "--max-steps", "1", "--init-drafter", ckpt)
    warm = read_metrics(tmp_path / "warm")
    assert warm[0]["loss"] < 0.9 * first[0]["loss"]  # the same first batch, from trained weights
    assert warm[0]["data_crc"] == first[0]["data_crc"]

    result = subprocess.run(train_cmd(tiny, tmp_path / "other", "--block-size", "8", "--init-drafter", ckpt),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is another drafter (block_size 4 there, 8 here)" in lines[0], result.stderr
    assert not os.path.exists(tmp_path / "other" / "checkpoints")
