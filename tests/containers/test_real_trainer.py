"""The real trainer (checkout's trainer/ wheel) in a real container, driven by the project's own playbooks
(restart_training.yml / training_status.yml / stop_training.yml -e run=tiny) over ssh -tt + pct."""
import time

import pytest

from harness.fixtures import REPO_ROOT

pytestmark = pytest.mark.containers
PLAYBOOKS = REPO_ROOT / "playbooks"
RESTART_TASK = "Training run tiny: restarted"
CKPT = "/workspace/checkpoints/tiny/checkpoints"


def _latest_step(ct):
    name = (ct.read(f"{CKPT}/latest") or "").strip()
    return int(name.rsplit("-", 1)[1]) if name.startswith("step-") else None


def test_restart_resumes_from_last_checkpoint(play, make_container):
    ct = make_container(200, trainer=True)
    print(f"\n[harness] clone {ct.clone_s:.2f}s, timings {ct.timings}")
    r1 = play(PLAYBOOKS / "restart_training.yml", {"run": "tiny"}, limit="ct200")
    res1 = r1.task(RESTART_TASK)
    assert r1.rc == 0 and res1["action"] == "launched", (res1, r1.stdout[-3000:])
    assert res1["phase"] == "training"
    # wait for a checkpoint (checkpoint_interval 20 in inventories/harness)
    deadline = time.monotonic() + 240
    while _latest_step(ct) is None:
        assert time.monotonic() < deadline, "no checkpoint within 240s"
        time.sleep(1)
    first_ckpt = _latest_step(ct)
    # the same configuration again: nothing to do
    r2 = play(PLAYBOOKS / "restart_training.yml", {"run": "tiny"}, limit="ct200")
    res2 = r2.task(RESTART_TASK)
    assert res2["action"] == "noop" and res2["changed"] is False and res2["pid"] == res1["pid"], res2
    # forced restart: SIGTERM -> the trainer checkpoints and exits -> relaunch resumes from `latest`
    r3 = play(PLAYBOOKS / "restart_training.yml", {"run": "tiny", "force": True}, limit="ct200")
    res3 = r3.task(RESTART_TASK)
    assert r3.rc == 0 and res3["action"] == "launched" and res3["pid"] != res1["pid"], (res3, r3.stdout[-3000:])
    assert [s["signal"] for s in res3.get("stopped", [])] == ["SIGTERM"], res3.get("stopped")
    # the first run's log is kept (moved aside); its last checkpoint line is where the new run must resume
    logs = [f for f in ct.sh("ls /workspace/runs/tiny").stdout.split() if f.startswith("train") and f.endswith(".log")]
    assert len(logs) == 2 and "train.log" in logs, logs
    old_log = ct.read("/workspace/runs/tiny/" + next(f for f in logs if f != "train.log"))
    last_ckpt = [ln for ln in old_log.splitlines() if ln.startswith(f"checkpoint {CKPT}/step-")][-1]
    step_at_stop = int(last_ckpt.split("step-")[1].split()[0])
    assert step_at_stop >= first_ckpt
    log = ct.read("/workspace/runs/tiny/train.log") or ""
    assert f"resumed from {CKPT}/step-{step_at_stop} at step {step_at_stop}" in log, log[-2000:]
    assert res3["heartbeat"]["step"] >= step_at_stop, res3["heartbeat"]
    assert ct.pids("dflash-train") == [res3["pid"]]
    # status and stop through the project's playbooks
    st = play(PLAYBOOKS / "training_status.yml", {"run": "tiny"}, limit="ct200")
    assert st.rc == 0, st.stdout[-2000:]
    sp = play(PLAYBOOKS / "stop_training.yml", {"run": "tiny"}, limit="ct200")
    assert sp.rc == 0, sp.stdout[-2000:]
    time.sleep(0.5)
    assert ct.pids("dflash-train") == []
    print(f"[harness] restart_training.yml via ssh+pct: launch {r1.seconds:.1f}s (verify "
          f"{res1['timings'].get('verify')}s), noop {r2.seconds:.1f}s, forced restart {r3.seconds:.1f}s "
          f"(timings {res3['timings']})")
