"""A rank that raises removes its own pid file (<run-dir>/ranks/<rank>.pid): torchrun jobs on the CPU (gloo) that
fail on purpose, once while the ranks start (the layout refused in init_world, every rank) and once after start (the
drafter rank's queue-memory refusal; the target rank's barrier breaks with it). A SIGKILLed rank cannot clean up:
the collection counts a pid file whose process is gone as a dead rank (test_job_ranks)."""

from __future__ import annotations

import os

import pytest

from trainer_testlib import start, torchrun_cmd


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target_ranks,extra,refusal", [
    (2, (), r"--target-ranks 2 leaves 0 drafter ranks"),
    (1, ("--hs-queue-depth", "1000000000"), "dflash-train: error: rank 1: "),
])
def test_a_rank_that_raises_leaves_no_pid_file(tiny, tmp_path, target_ranks, extra, refusal):
    out = tmp_path / "out"
    proc = start(torchrun_cmd(tiny, out, 2, target_ranks, *extra), tmp_path / "log")
    try:
        status = proc.wait(timeout=50)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "log").read_text()
    assert status != 0 and refusal in log, log[-3000:]
    assert os.path.isdir(out / "ranks"), log[-3000:]  # the ranks did register (init_world makes the directory)
    assert [n for n in os.listdir(out / "ranks") if ".pid" in n] == [], log[-3000:]
