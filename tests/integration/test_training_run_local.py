"""training_run through ansible-runner against real child processes (local mode)."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from ansible_helpers import FAKE, live_pids_with, starts

pytestmark = pytest.mark.timeout(120)
TR = "dflash.ops.training_run"


def args(runs_root, name="r1", **extra):
    a = {"name": name, "transport": "local", "runs_root": str(runs_root), "command": [FAKE],
         "stop_timeout": 5, "heartbeat_timeout": 10}
    a.update(extra)
    return a


def marker(tag):
    return "--tag=%s" % tag


def test_launch_is_live_and_writes_the_run_contract(ansible, runs_root):
    ok, res = ansible.module("dflash.ops.training_run", args(runs_root, trainer_args={"tag": "t-live"}))
    assert ok, res["msg"]
    assert res["changed"] and res["action"] == "launched"
    run_dir = runs_root / "r1"
    pid = int((run_dir / "pid").read_text())
    assert res["pid"] == pid and res["heartbeat"]["pid"] == pid
    assert live_pids_with(marker("t-live")) == [pid]
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["argv"] == [FAKE, "--tag=t-live"] and launch["fingerprint"] == res["fingerprint"]
    assert os.getsid(pid) == pid, "the trainer must lead its own session (no controlling terminal)"
    assert set(res["timings"]) >= {"lock", "stop", "gpu_wait", "launch", "verify"}
    assert res["gpu_wait"]["skipped"] and "no GPUs" in res["gpu_wait"]["reason"]


def test_same_settings_again_is_a_noop(ansible, runs_root):
    a = args(runs_root, trainer_args={"tag": "t-noop", "lr": 0.1})
    (ok, first), (ok_second, second) = ansible.modules(TR, [(a, False, False)] * 2)  # one ansible-playbook run
    assert ok
    assert ok_second and not second["changed"] and second["action"] == "noop"
    assert second["pid"] == first["pid"]
    assert live_pids_with(marker("t-noop")) == [first["pid"]]
    assert len(starts(runs_root / "r1")) == 1


def test_check_mode_reports_without_acting(ansible, runs_root):
    a = args(runs_root, trainer_args={"tag": "t-check"})
    ok, res = ansible.module("dflash.ops.training_run", a, check=True)
    assert ok and res["changed"] and not (runs_root / "r1" / "pid").exists()
    changed = dict(a, trainer_args=dict(a["trainer_args"], lr=0.5))
    # one ansible-playbook run: the launch, the same in check mode, then a changed setting in check mode
    (_, first), (ok, res), (ok_changed, res_changed) = ansible.modules(
        TR, [(a, False, False), (a, True, False), (changed, True, False)])
    assert ok and not res["changed"]
    assert ok_changed and res_changed["changed"] and res_changed["would_stop"] == ["r1"]
    assert live_pids_with(marker("t-check")) == [first["pid"]], "check mode must not stop the run"


def test_changed_setting_restarts_and_keeps_the_old_log(ansible, runs_root):
    (ok, first), (ok_second, second) = ansible.modules(TR, [  # one ansible-playbook run
        (args(runs_root, trainer_args={"tag": "t-chg", "lr": lr}), False, False) for lr in (1, 2)])
    assert ok
    assert ok_second and second["changed"] and second["pid"] != first["pid"]
    assert [s["pid"] for s in second["stopped"]] == [first["pid"]] and second["stopped"][0]["signal"] == "SIGTERM"
    assert live_pids_with(marker("t-chg")) == [second["pid"]]
    kept_logs = [p for p in second["kept"] if p.endswith(".log")]
    assert len(kept_logs) == 1
    with open(kept_logs[0]) as f:
        old = f.read()
    assert "fake_trainer pid=%d" % first["pid"] in old and "fake_trainer: exiting" in old
    assert (runs_root / "r1" / "train.log").read_text().count("fake_trainer pid=") == 1


def test_force_restarts_the_same_settings(ansible, runs_root):
    a = args(runs_root, trainer_args={"tag": "t-force"})
    (_, first), (ok, second) = ansible.modules(TR, [(a, False, False), (dict(a, force=True), False, False)])
    assert ok and second["changed"] and second["pid"] != first["pid"]
    assert live_pids_with(marker("t-force")) == [second["pid"]]


def test_crash_at_start_fails_with_exit_status_and_log_tail(ansible, runs_root):
    (ok_first, first), (ok, res) = ansible.modules(TR, [  # one ansible-playbook run
        (args(runs_root, trainer_args={"tag": "t-crash"}), False, False),
        (args(runs_root, trainer_args={"tag": "t-crash", "crash": 3}), False, False)])
    assert ok_first
    assert not ok
    assert res["rc"] == 3
    assert "failed right after launch (exit 3)" in res["msg"]
    assert any("crashing at start with status 3" in line for line in res["log_tail"])
    old_logs = list((runs_root / "r1").glob("train.*.log"))
    assert len(old_logs) == 1 and "fake_trainer: exiting" in old_logs[0].read_text()


def test_missing_trainer_binary_fails_clearly(ansible, runs_root):
    a = args(runs_root)
    a["command"] = [str(runs_root / "no-such-trainer")]
    ok, res = ansible.module("dflash.ops.training_run", a)
    assert not ok and res["rc"] == 127
    assert "no-such-trainer does not exist: run playbooks/install_trainer.yml" in res["msg"]


def test_process_ignoring_sigterm_is_killed_after_grace(ansible, runs_root):
    (ok_first, first), (ok, res) = ansible.modules(TR, [  # one ansible-playbook run
        (args(runs_root, trainer_args={"tag": "t-ign", "ignore_term": True}), False, False),
        (args(runs_root, stop_timeout=1.5, trainer_args={"tag": "t-ign", "lr": 3}), False, False)])
    assert ok_first
    assert ok, res.get("msg")
    stop = res["stopped"][0]
    assert stop["signal"] == "SIGKILL" and stop["waited_s"] >= 1.5
    assert live_pids_with(marker("t-ign")) == [res["pid"]]


def test_slow_exit_is_waited_for_not_killed(ansible, runs_root):
    (ok_first, first), (ok, res) = ansible.modules(TR, [  # one ansible-playbook run
        (args(runs_root, trainer_args={"tag": "t-slow", "slow_exit": 2}), False, False),
        (args(runs_root, stop_timeout=20, trainer_args={"tag": "t-slow", "lr": 4}), False, False)])
    assert ok_first
    assert ok
    stop = res["stopped"][0]
    assert stop["signal"] == "SIGTERM" and 2.0 <= stop["waited_s"] < 20
    kept = [p for p in res["kept"] if p.endswith(".log")][0]
    with open(kept) as f:
        assert "fake_trainer: exiting" in f.read()


def test_forked_child_holding_stdout_does_not_hang(ansible, runs_root):
    t0 = time.monotonic()
    ok, res = ansible.module("dflash.ops.training_run",
                             args(runs_root, trainer_args={"tag": "t-fork", "fork_holder": True}))
    assert ok and time.monotonic() - t0 < 30
    assert len(live_pids_with(marker("t-fork"))) == 2  # the trainer and its child
    ok, res = ansible.module("dflash.ops.training_run", args(runs_root, state="stopped", stop_timeout=1))
    assert ok and res["changed"]
    assert live_pids_with(marker("t-fork")) == [], "the whole process group must be gone"


def test_no_heartbeat_fails_naming_the_pid(ansible, runs_root):
    ok, res = ansible.module("dflash.ops.training_run", args(
        runs_root, heartbeat_timeout=1, trainer_args={"tag": "t-nohb", "no_heartbeat": True}))
    assert not ok and "wrote no heartbeat" in res["msg"] and str(res["pid"]) in res["msg"]


def test_two_restarts_at_once_are_serialized(ansible, runs_root):
    results = {}

    def go(lr):
        results[lr] = ansible.module("dflash.ops.training_run",
                                     args(runs_root, trainer_args={"tag": "t-race", "lr": lr}))

    threads = [threading.Thread(target=go, args=(lr,)) for lr in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(ok for ok, _ in results.values()), [r.get("msg") for _, r in results.values()]
    alive = live_pids_with(marker("t-race"))
    assert len(alive) == 1
    assert int((runs_root / "r1" / "pid").read_text()) == alive[0]
    # One of them launched second and stopped the first one's process.
    later = [r for _, r in results.values() if r["stopped"]]
    assert len(later) == 1


def test_runs_sharing_a_gpu_are_stopped_first(ansible, runs_root, tmp_path):
    dev = tmp_path / "gpu{index}"
    for index in (1, 5, 6, 7):  # without NVML a GPU index needs its device file (stand-ins for /dev/nvidiaN)
        (tmp_path / ("gpu%d" % index)).write_text("")
    a = args(runs_root, name="old", gpus=[5, 6], gpu_device_pattern=str(dev), trainer_args={"tag": "t-gpu-old"})
    b = args(runs_root, name="other", gpus=[1], gpu_device_pattern=str(dev), trainer_args={"tag": "t-gpu-other"})
    c = args(runs_root, name="new", gpus=[6, 7], gpu_device_pattern=str(dev), trainer_args={"tag": "t-gpu-new"})
    (_, old), (_, other), (ok, new) = ansible.modules(TR, [(x, False, False) for x in (a, b, c)])  # one run
    assert ok and [s["run"] for s in new["stopped"]] == ["old"]
    assert live_pids_with(marker("t-gpu-old")) == []
    assert live_pids_with(marker("t-gpu-other")) == [other["pid"]]
    assert "NVML" in new["gpu_wait"]["reason"] or "pynvml" in new["gpu_wait"]["reason"]


def test_stray_gpu_holder_times_out_naming_its_pid(ansible, runs_root, tmp_path):
    dev = tmp_path / "gpu3"
    dev.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1]); print('ready', flush=True);"
                               " time.sleep(60)", str(dev)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"ready"  # it holds the device before the module looks
        ok, res = ansible.module("dflash.ops.training_run", args(
            runs_root, gpus=[3], gpu_device_pattern=str(tmp_path / "gpu{index}"), gpu_release_timeout=1))
        assert not ok
        assert "pid %d" % holder.pid in res["msg"] and "not released" in res["msg"]
        assert res["msg"].startswith("run r1: GPUs 3 were not released"), res["msg"]  # a refusal, not a crash
        assert res["timings"]["gpu_wait"] >= 1.0 and res["stopped"] == []
        assert not (runs_root / "r1" / "pid").exists() and not (runs_root / "r1" / "launch.json").exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_status_reports_alive_then_dead(ansible, runs_root):
    # no periodic checkpoint: its heartbeat says "checkpointing" for a moment, which a loaded machine caught
    # (a fresh clone of b029633, 2026-12-06)
    (_, first), (ok, st) = ansible.modules(TR, [  # one ansible-playbook run
        (args(runs_root, trainer_args={"tag": "t-st", "ckpt_every": 0}), False, False),
        (args(runs_root, state="status"), False, False)])
    assert ok and st["alive"] and st["pid"] == first["pid"] and st["phase"] == "training"
    assert st["heartbeat_age_s"] < 5 and not st["changed"]
    os.killpg(first["pid"], 9)
    time.sleep(0.3)
    (ok, st), (ok_stop, stop) = ansible.modules(TR, [  # one ansible-playbook run
        (args(runs_root, state="status"), False, False), (args(runs_root, state="stopped"), False, False)])
    assert ok and not st["alive"] and st["phase"] == "dead" and st["dead_since"] > 0
    assert ok_stop and not stop["changed"]
