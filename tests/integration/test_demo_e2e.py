"""The demo path end to end: the real dflash-train on a tiny target, launched by restart_training.yml with the
local inventory, trains; a no-op re-run keeps it; stop checkpoints; a restart resumes from that checkpoint."""
import json
import os
import subprocess
import sys
import time

import pytest
from ansible_helpers import BIN, ROOT, run_project_playbook

pytestmark = pytest.mark.timeout(400)
def play(tmp_path, playbook):
    status, events = run_project_playbook(
        tmp_path / ("runner-%s-%d" % (playbook, time.monotonic_ns())), playbook,
        os.path.join(ROOT, "inventories", "local"),
        {"run": "demo", "dflash_demo_models": str(tmp_path / "models"), "dflash_demo_root": str(tmp_path / "demo"),
         "ansible_python_interpreter": sys.executable,
         # 0.2 s after each step (the trainer's test hook, merged into the demo's env): the run only has to live and
         # step through the plays
         "dflash_runs": {"demo": {"env": {"DFLASH_DEBUG_STEP_PAUSE_S": "0.2"}}}})
    res = [e["res"] for e in events if e["task"].startswith("Training run")]
    assert status == "successful" and res, (res[-1].get("msg") if res else status)
    return res[-1]


def heartbeat(tmp_path):
    with open(str(tmp_path / "demo" / "runs" / "demo" / "heartbeat.json")) as f:
        return json.load(f)


def wait_for_step(tmp_path, step, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hb = heartbeat(tmp_path)
        if (hb.get("step") or 0) >= step:
            return hb
        time.sleep(0.1)
    raise AssertionError("no step %d within %ss: %s" % (step, timeout, hb))


def test_demo_trains_through_the_collection_and_resumes(tmp_path):
    subprocess.run([os.path.join(BIN, "dflash-make-tiny"), "--target-dir", str(tmp_path / "models" / "target"),
                    "--data-dir", str(tmp_path / "models" / "data")], check=True, capture_output=True)
    pid = None
    try:
        first = play(tmp_path, "restart_training.yml")
        pid = first["pid"]
        assert first["changed"] and first["phase"] == "training"
        hb = wait_for_step(tmp_path, 5)
        assert hb["pid"] == pid and hb["loss"] is not None
        again = play(tmp_path, "restart_training.yml")
        assert not again["changed"] and again["pid"] == pid
        status = play(tmp_path, "training_status.yml")
        assert status["alive"] and status["phase"] == "training" and status["step"] >= 5
        stopped = play(tmp_path, "stop_training.yml")
        assert stopped["stopped"][0]["signal"] == "SIGTERM"
        final = heartbeat(tmp_path)
        assert final["phase"] == "finished"
        saved_step = final["step"]
        ckpts = tmp_path / "demo" / "checkpoints" / "demo" / "checkpoints"
        assert (ckpts / "latest").exists()
        resumed = play(tmp_path, "restart_training.yml")
        pid = resumed["pid"]
        assert resumed["changed"] and resumed["pid"] != first["pid"]
        log = (tmp_path / "demo" / "runs" / "demo" / "train.log").read_text()
        assert "resumed from" in log and ("at step %d" % saved_step) in log, log[-2000:]
        assert len(list((tmp_path / "demo" / "runs" / "demo").glob("train.*.log"))) == 1
    finally:
        if pid:
            try:
                os.killpg(pid, 9)
            except ProcessLookupError:
                pass
