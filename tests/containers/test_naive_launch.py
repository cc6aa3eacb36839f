"""Regression: the harness reproduces the bug this project exists to fix.

The seed's launch, `ssh -tt host "pct exec 200 -- bash -lc 'nohup sleep 600 > /tmp/log 2>&1 &'"`, loses its
background process when the terminal hangs up; dflash.ops.training_run through ansible-playbook over the same
ssh (-tt, no pipelining) + pct leaves exactly one process every time.
"""
import time
from pathlib import Path

import pytest

from harness.fixtures import FAKE_TRAINER_CT

PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"

pytestmark = pytest.mark.containers
TRIES = 20


def test_naive_nohup_launch_dies_with_the_terminal(sshd, ct200):
    survived = 0
    for i in range(TRIES):
        p = sshd.ssh("pct exec 200 -- bash -lc 'nohup sleep 600 > /tmp/log 2>&1 &'", tty=True, timeout=60)
        assert p.returncode == 0, p
        time.sleep(0.3)
        pids = ct200.pids("^sleep 600$")
        survived += len(pids)
        ct200.kill_matching("^sleep 600$")
    print(f"\nnaive `ssh -tt ... pct exec 200 -- bash -lc 'nohup sleep 600 &'`: {survived}/{TRIES} survived")
    # the control: same command without a terminal survives (so the harness is not just failing to launch)
    p = sshd.ssh("pct exec 200 -- bash -lc 'nohup sleep 600 > /tmp/log 2>&1 &'", timeout=60)
    time.sleep(0.3)
    control = len(ct200.pids("^sleep 600$"))
    ct200.kill_matching("^sleep 600$")
    print(f"control without -tt: {control}/1 survived")
    assert control == 1
    assert survived <= TRIES // 4, f"{survived}/{TRIES} naive launches survived: the harness does not reproduce the bug"


def test_training_run_leaves_exactly_one_process(play, ct200):
    counts, pids, secs = [], set(), []
    for i in range(TRIES):
        r = play(PLAYBOOKS / "training_run.yml", {"tr": {
            "name": "regress", "command": ["python3", FAKE_TRAINER_CT], "force": True,
            "settle_time": 0.5, "heartbeat_timeout": 20, "stop_timeout": 10, "gpu_release_timeout": 5}})
        secs.append(r.seconds)
        res = r.task("Training run")
        assert r.rc == 0 and r.outcome("Training run") == "ok", (res, r.stdout[-3000:])
        assert res["action"] == "launched" and res["changed"] is True
        time.sleep(0.3)
        alive = ct200.pids("fake_trainer.py")
        counts.append(len(alive))
        assert alive == [res["pid"]], (alive, res)
        pids.add(res["pid"])
    print(f"\ntraining_run via ansible-playbook (ssh -tt + pct): exactly one process in "
          f"{counts.count(1)}/{TRIES} tries; counts={counts}; {len(pids)} distinct pids; "
          f"playbook {min(secs):.1f}-{max(secs):.1f}s")
    assert counts == [1] * TRIES and len(pids) == TRIES
