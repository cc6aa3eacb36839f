"""Real dflash-train subprocesses: kill -9 and resume, a kill during a checkpoint write, SIGTERM."""

import os
import re
import signal

import pytest
import torch

from trainer_testlib import read_heartbeat, read_metrics, start, train_cmd, wait_for
from dflash_trainer.loop.checkpoint import find_latest, load_checkpoint


def _latest_step(out):
    path = find_latest(str(out))
    return int(os.path.basename(path).split("-")[1]) if path else None


def test_kill9_then_resume_continues_at_saved_step_with_same_data(tiny, tmp_path):
    args = ("--max-steps", "10", "--checkpoint-interval", "3")
    ref = start(train_cmd(tiny, tmp_path / "ref", *args), tmp_path / "ref.log")
    run = start(train_cmd(tiny, tmp_path / "run", *args), tmp_path / "run.log")
    try:
        wait_for(lambda: (_latest_step(tmp_path / "run") or 0) >= 3, proc=run)
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        assert ref.wait(timeout=120) == 0
    finally:
        for p in (ref, run):
            if p.poll() is None:
                p.kill()
    saved = _latest_step(tmp_path / "run")
    assert saved is not None and saved < 10
    again = start(train_cmd(tiny, tmp_path / "run", *args), tmp_path / "run2.log")
    assert again.wait(timeout=120) == 0
    log = (tmp_path / "run2.log").read_text()
    assert re.search(rf"resumed from .*step-{saved} at step {saved}\b", log), log
    assert "other training settings" not in log  # the same flags: nothing to say
    hb = read_heartbeat(tmp_path / "run")
    assert hb["phase"] == "finished" and hb["step"] == 10 and hb["pid"] == again.pid

    ref_rows = {r["step"]: r for r in read_metrics(tmp_path / "ref")}
    rows = read_metrics(tmp_path / "run")
    after = [r for r in rows[-(10 - saved):]]                 # the resumed process's rows
    assert [r["step"] for r in after] == list(range(saved + 1, 11))
    for r in after:
        assert r["data_crc"] == ref_rows[r["step"]]["data_crc"], r["step"]   # identical data order
        assert abs(r["loss"] - ref_rows[r["step"]]["loss"]) < 1e-4 * max(1.0, abs(r["loss"]))


def test_kill_during_checkpoint_write_keeps_latest_loadable(tiny, tmp_path):
    out = tmp_path / "out"
    first = start(train_cmd(tiny, out, "--max-steps", "2", "--checkpoint-interval", "2"), tmp_path / "a.log")
    assert first.wait(timeout=120) == 0 and _latest_step(out) == 2
    slow = start(train_cmd(tiny, out, "--max-steps", "6", "--checkpoint-interval", "2"), tmp_path / "b.log",
                 env={"DFLASH_DEBUG_CHECKPOINT_PAUSE_S": "60"})
    try:
        tmp_dir = out / "checkpoints" / ".tmp-step-4"
        wait_for(lambda: (tmp_dir / "train_state.pt").exists(), proc=slow)   # mid-write, before the rename
        slow.send_signal(signal.SIGKILL)
        slow.wait(timeout=30)
    finally:
        if slow.poll() is None:
            slow.kill()
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-2"
    model, cfg, state = load_checkpoint(find_latest(str(out)))
    assert state["step"] == 2 and "fc.weight" in model
    resumed = start(train_cmd(tiny, out, "--max-steps", "6", "--checkpoint-interval", "2"), tmp_path / "c.log")
    assert resumed.wait(timeout=120) == 0
    log = (tmp_path / "c.log").read_text()
    assert "at step 2" in log
    # the first run's --max-steps 2 became 6: the restart says so (its schedule stretches from step 2 on)
    assert "resumed with other training settings than the checkpoint's run: --max-steps 2 -> 6" in log, log
    assert _latest_step(out) == 6 and not tmp_dir.exists()


def test_sigterm_checkpoints_and_exits_zero(tiny, tmp_path):
    out = tmp_path / "out"
    proc = start(train_cmd(tiny, out, "--max-steps", "100000", "--epochs", "1000", "--checkpoint-interval", "1000"),
                 tmp_path / "log")
    try:
        wait_for(lambda: (read_heartbeat(out) or {}).get("step", 0) >= 2, proc=proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    hb = read_heartbeat(out)
    assert hb["phase"] == "finished" and hb["stopped"] == "SIGTERM" and "error" not in hb
    step = _latest_step(out)
    assert step == hb["step"] and step >= 2
    _, _, state = load_checkpoint(find_latest(str(out)))
    assert state["step"] == step and set(state) >= {"optimizer", "scheduler", "data", "rng"}
    assert isinstance(state["rng"]["torch"], torch.Tensor)


@pytest.mark.slow
def test_kill_during_prune_leaves_nothing_incomplete_after_the_next_checkpoint(tiny, tmp_path):
    """A kill timed into pruning (the old step-N renamed aside, mid-delete) and a step-N an older trainer's
    prune cut short (only train_state.pt left, as issue 37 found): the next start and checkpoint remove both,
    saying what and how many bytes, never `latest`; the run resumes from the newest complete checkpoint."""
    out, root = tmp_path / "out", tmp_path / "out" / "checkpoints"
    args = ("--checkpoint-interval", "1", "--keep-checkpoints", "1")
    slow = start(train_cmd(tiny, out, "--max-steps", "4", *args), tmp_path / "a.log",
                 env={"DFLASH_DEBUG_PRUNE_PAUSE_S": "60"})
    try:
        wait_for(lambda: (root / ".pruning-step-1").exists(), proc=slow)   # step-2 is `latest`; step-1 is going
        slow.send_signal(signal.SIGKILL)
        slow.wait(timeout=30)
    finally:
        if slow.poll() is None:
            slow.kill()
    assert (root / "latest").read_text().strip() == "step-2" and not (root / "step-1").exists()
    half = root / "step-0"  # what an older trainer's cut prune left: the optimizer state alone
    half.mkdir()
    (half / "train_state.pt").write_bytes(b"x" * 1000)
    again = start(train_cmd(tiny, out, "--max-steps", "4", *args), tmp_path / "b.log")
    assert again.wait(timeout=120) == 0
    log = (tmp_path / "b.log").read_text()
    assert re.search(r"removed .*\.pruning-step-1 \(\d+ bytes\)", log), log
    assert re.search(r"removed .*step-0 \(1000 bytes\)", log), log
    assert re.search(r"resumed from .*step-2 at step 2\b", log), log
    assert sorted(os.listdir(root)) == ["latest", "step-4"]
