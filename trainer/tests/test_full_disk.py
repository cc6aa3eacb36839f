"""A checkpoint write that meets a full disk (issue 20): on a real, small tmpfs, through dflash-train.

The trainer removes its partial checkpoint, prints one line with the path and the free/needed bytes, sets the
heartbeat to `failed` with that line and exits 1; `latest` stays the previous complete checkpoint, which loads,
and the run resumes from it once space is freed. Mounting needs root (the harness machines run tests as root)."""

from __future__ import annotations

import os
import re

import pytest

from trainer_testlib import dir_bytes, fill, read_heartbeat, read_metrics, small_tmpfs, start, train_cmd, wait_for
from dflash_trainer.loop.checkpoint import checkpoints_dir, find_latest, load_checkpoint
from dflash_trainer.telemetry.heartbeat import RESERVE_NAME, Heartbeat

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "disk") as mount_point:
        yield mount_point


def test_heartbeat_failed_reaches_a_full_disk_through_its_reserve(small_disk):
    run_dir = small_disk / "run"
    heartbeat = Heartbeat(str(run_dir))
    heartbeat.write()
    assert os.path.getsize(run_dir / RESERVE_NAME) > 0
    fill(small_disk, 0)
    with pytest.raises(OSError):  # the disk really is full: an ordinary file cannot be written
        (small_disk / "probe").write_bytes(b"x" * 8192)
    heartbeat.set_phase("failed", error="disk full")
    assert read_heartbeat(str(run_dir))["phase"] == "failed"
    assert read_heartbeat(str(run_dir))["error"] == "disk full"
    assert not (run_dir / RESERVE_NAME).exists()
    assert [n for n in os.listdir(run_dir) if ".tmp-" in n] == []


def test_checkpoint_on_a_full_disk_fails_cleanly_and_resumes(tiny, small_disk, tmp_path):
    out = small_disk / "out"
    args = ("--checkpoint-interval", "3", "--keep-checkpoints", "2", "--epochs", "1000")
    proc = start(train_cmd(tiny, out, *args), tmp_path / "a.log")
    first = wait_for(lambda: find_latest(str(out)), proc=proc)
    filler = fill(small_disk, dir_bytes(first) // 2)  # room for the metrics rows, not for a checkpoint
    assert proc.wait(timeout=120) == 1

    log = (tmp_path / "a.log").read_text()
    root = checkpoints_dir(str(out))
    lines = [line for line in log.splitlines() if line.startswith("dflash-train: error:")]
    assert len(lines) == 1, log
    m = re.fullmatch(rf"dflash-train: error: checkpoint step-(\d+) could not be written in {re.escape(root)}: "
                     r"no space left on device .*; (\d+) bytes free there, about (\d+) needed; the partial checkpoint was removed and "
                     r"`latest` stays (step-\d+); .*start the run again to resume", lines[0])
    assert m, lines[0]
    failed_step, free, needed, kept = int(m[1]), int(m[2]), int(m[3]), m[4]
    assert free < needed
    assert "Traceback" not in log

    heartbeat = read_heartbeat(str(out))
    assert heartbeat["phase"] == "failed" and heartbeat["error"] == lines[0].removeprefix("dflash-train: error: ")
    assert [n for n in os.listdir(root) if n.startswith(".")] == []  # no partial checkpoint, no temp `latest`
    assert not os.path.exists(os.path.join(root, f"step-{failed_step}"))
    latest = find_latest(str(out))
    assert os.path.basename(latest) == kept and (open(os.path.join(root, "latest")).read().strip() == kept)
    _, _, state = load_checkpoint(latest)
    assert state["step"] == int(kept.removeprefix("step-")) < failed_step

    filler.unlink()
    again = start(train_cmd(tiny, out, *args[:4], "--max-steps", str(state["step"] + 2)), tmp_path / "b.log")
    assert again.wait(timeout=120) == 0
    assert f"resumed from {latest} at step {state['step']}" in (tmp_path / "b.log").read_text()
    assert read_heartbeat(str(out))["phase"] == "finished"
    assert read_metrics(str(out))[-1]["step"] == state["step"] + 2
