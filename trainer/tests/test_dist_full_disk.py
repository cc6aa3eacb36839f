"""A checkpoint write that meets a full disk under torchrun, on a real 32 MiB tmpfs (as test_full_disk.py does for
one process; mounting needs root): 1 target + 2 drafter ranks (gloo) on the tiny CPU fixtures.

The first drafter rank writes checkpoints with the same save as one process: it removes the partial checkpoint
and fails with the same one line (naming its rank); the job ends non-zero with no rank left, rank 0's heartbeat
says `failed` with that line, `latest` stays the previous checkpoint and the run resumes from it."""

from __future__ import annotations

import os
import re

import pytest

from trainer_testlib import (alive, dir_bytes, fill, rank_pids, read_heartbeat, read_metrics, small_tmpfs, start,
                             torchrun_cmd, wait_for)
from dflash_trainer.loop.checkpoint import checkpoints_dir, find_latest, load_checkpoint

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.mark.timeout(300)
def test_checkpoint_on_a_full_disk_ends_the_job_with_the_one_line_and_resumes(tiny, tmp_path):
    with small_tmpfs(tmp_path / "disk") as disk:
        out = disk / "out"
        args = ("--checkpoint-interval", "3", "--keep-checkpoints", "2", "--hs-queue-depth", "4",
                "--hs-queue-min-ready", "2")
        proc = start(torchrun_cmd(tiny, out, 3, 1, *args, "--epochs", "1000"), tmp_path / "a.log")
        try:
            pids = rank_pids(out, 3)
            first = wait_for(lambda: find_latest(str(out)), proc=proc)
            filler = fill(disk, dir_bytes(first) // 2)  # room for the metrics rows, not for a checkpoint
            status = proc.wait(timeout=60)  # never a hang: the ranks blocked with the writer end too
        finally:
            if proc.poll() is None:
                proc.kill()
        assert status == 1
        wait_for(lambda: not any(alive(p) for p in pids), timeout=10)

        log = (tmp_path / "a.log").read_text()
        root = checkpoints_dir(str(out))
        lines = [line for line in log.splitlines() if line.startswith("dflash-train: error:")]
        assert len(lines) == 1, log[-4000:]
        m = re.fullmatch(rf"dflash-train: error: rank 1: checkpoint step-(\d+) could not be written in "
                         rf"{re.escape(root)}: no space left on device .*; (\d+) bytes free there, about (\d+) needed; "
                         r"the partial checkpoint was removed and `latest` stays (step-\d+); .*start the run again to "
                         r"resume", lines[0])
        assert m, lines[0]
        failed_step, free, needed, kept = int(m[1]), int(m[2]), int(m[3]), m[4]
        assert free < needed
        # the writer's failure is the job's: the other ranks' broken collectives name it, without tracebacks
        assert "/dflash_trainer/" not in log  # no frame of ours: the only traceback is torchrun's ChildFailedError
        for rank, role in ((0, "target 0"), (2, "drafter 1")):
            assert re.search(rf"\[rank {rank} {role}\] error: .*\(after rank 1 failed\)", log), log[-4000:]

        heartbeat = read_heartbeat(str(out))  # rank 0's, on the full disk (its reserve made room)
        assert heartbeat["phase"] == "failed" and heartbeat["error"] == lines[0].removeprefix("dflash-train: error: ")
        assert [n for n in os.listdir(root) if n.startswith(".")] == []  # no partial checkpoint, no temp `latest`
        assert not os.path.exists(os.path.join(root, f"step-{failed_step}"))
        latest = find_latest(str(out))
        assert os.path.basename(latest) == kept and open(os.path.join(root, "latest")).read().strip() == kept
        _, _, state = load_checkpoint(latest)
        assert state["step"] == int(kept.removeprefix("step-")) < failed_step

        filler.unlink()
        again = start(torchrun_cmd(tiny, out, 3, 1, *args, "--max-steps", str(state["step"] + 2)), tmp_path / "b.log")
        assert again.wait(timeout=120) == 0, (tmp_path / "b.log").read_text()[-3000:]
        assert f"resumed from {latest} at step {state['step']}" in (tmp_path / "b.log").read_text()
        assert read_heartbeat(str(out))["phase"] == "finished"
        assert read_metrics(str(out))[-1]["step"] == state["step"] + 2
