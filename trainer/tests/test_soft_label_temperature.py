"""--soft-label-temperature through dflash-train: one process and a torchrun drafter rank (CPU, gloo) train
towards the sharpened target distribution, and say so in the log."""

from __future__ import annotations

import subprocess

from trainer_testlib import read_metrics, torchrun_cmd, train_cmd

STEPS = ("--max-steps", "2", "--use-soft-labels")


def _first_loss(cmd, out):
    log = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert log.returncode == 0, log.stderr[-2000:]
    return read_metrics(out)[0]["loss"], log.stderr + log.stdout


def test_temperature_changes_the_objective_in_one_process_and_on_a_torchrun_drafter_rank(tiny, tmp_path):
    warm, _ = _first_loss(train_cmd(tiny, tmp_path / "t1", *STEPS), tmp_path / "t1")
    sharp, log = _first_loss(train_cmd(tiny, tmp_path / "t05", *STEPS, "--soft-label-temperature", "0.5"),
                             tmp_path / "t05")
    assert "soft (temperature 0.5) labels" in log
    assert abs(sharp - warm) > 1e-3 * abs(warm)       # same weights and batch at step 1: only the labels differ
    ranks, _ = _first_loss(torchrun_cmd(tiny, tmp_path / "tr", 2, 1, *STEPS, "--soft-label-temperature", "0.5"),
                           tmp_path / "tr")
    assert abs(ranks - sharp) <= 1e-4 * abs(sharp)    # the drafter rank trains the same objective
