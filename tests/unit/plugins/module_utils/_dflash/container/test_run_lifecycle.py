"""run_lifecycle called directly (change / status / main), with requests built by run_config.build_request from
training_run's own defaults, and tests/harness/fake_trainer.py as the real trainer process. Every trainer a test
starts is recorded by the trainer itself in <run dir>/starts.jsonl; the fixture kills those groups at teardown."""
import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import (
    procfs, run_launch, run_lifecycle, run_records, run_status)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import run_config, training_backend

ROOT = os.path.dirname(os.path.abspath(__file__))
for _ in range(6):
    ROOT = os.path.dirname(ROOT)
FAKE = os.path.join(ROOT, "tests", "harness", "fake_trainer.py")
SECRET = "s3cr3t-value-never-on-disk"


@pytest.fixture
def runs_root(tmp_path):
    root = tmp_path / "runs"
    yield root
    # Kill what this test started: the pids its trainers recorded, when still ours (cmdline is fake_trainer).
    for starts in root.glob("*/starts.jsonl"):
        for line in starts.read_text().splitlines():
            pid = json.loads(line)["pid"]
            if procfs.is_alive(pid) and FAKE in (procfs.cmdline(pid) or []):
                procfs.stop_group(pid, 0)


def make_req(runs_root, name="r1", state="restarted", check_mode=False, diff=False, devices=True, **params):
    p = training_backend.argument_spec().defaults()
    p.update(name=name, state=state, transport="local", runs_root=str(runs_root), command=[sys.executable, FAKE],
             trainer_args={"interval": 0.05}, settle_time=0.1, heartbeat_timeout=5, stop_timeout=5,
             gpu_release_timeout=2, lock_timeout=5, log_tail_lines=10,
             gpu_device_pattern=str(runs_root.parent / "dev" / "nvidia{index}"))
    p.update(params)
    if devices:  # without NVML (as here) a GPU index needs its device file: these stand in for /dev/nvidiaN
        for index in p["gpus"] or []:
            dev = p["gpu_device_pattern"].format(index=index)
            os.makedirs(os.path.dirname(dev), exist_ok=True)
            open(dev, "a").close()
    return run_config.build_request(p, check_mode=check_mode, diff=diff)


def starts(runs_root, name="r1"):
    path = runs_root / name / "starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def read_pid(runs_root, name="r1"):
    return int((runs_root / name / "pid").read_text())


def run_main(req, capsys):
    run_lifecycle.main(req)
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.count("\n") == 1, out  # exactly one JSON line
    return json.loads(out)


def wait_dead(pid, timeout=5.0):
    deadline = time.monotonic() + timeout
    while procfs.is_alive(pid):
        assert time.monotonic() < deadline, "pid %d still alive" % pid
        time.sleep(0.02)


# --- launch ----------------------------------------------------------------------------------------------------

def test_launch_writes_pid_launch_json_without_secrets_and_log(runs_root):
    req = make_req(runs_root, env={"FAKE_HASH_ENV": "WANDB_API_KEY", "FAKE_SHOW_ENV": "DFLASH_RUN_NAME,HOME"},
                   secret_env={"WANDB_API_KEY": SECRET}, trainer_args={"interval": 0.05, "tag": "a"})
    res = run_lifecycle.change(req)
    run_dir = runs_root / "r1"
    pid = res["pid"]
    assert res["action"] == "launched" and res["changed"] is True and res["stopped"] == [] and res["kept"] == []
    assert read_pid(runs_root) == pid and procfs.is_alive(pid)
    assert procfs.proc_pgrp(pid) == pid  # its own session and group
    assert procfs.cmdline(pid) == req["argv"]
    assert res["heartbeat"]["pid"] == pid and res["phase"] == "training"
    assert res["fingerprint"] == req["fingerprint"] and res["log_path"] == str(run_dir / "train.log")
    assert {"lock", "stop", "gpu_wait", "launch", "verify", "first_heartbeat"} <= set(res["timings"])
    assert res["gpu_wait"]["skipped"] is True  # no GPUs configured

    text = (run_dir / "launch.json").read_text()
    launch = json.loads(text)
    assert SECRET not in text
    assert launch["secret_env_names"] == ["WANDB_API_KEY"] and "WANDB_API_KEY" not in launch["env"]
    assert launch["argv"] == req["argv"] and launch["fingerprint"] == req["fingerprint"]
    assert launch["env"] == {"FAKE_HASH_ENV": "WANDB_API_KEY", "FAKE_SHOW_ENV": "DFLASH_RUN_NAME,HOME"}
    assert launch["gpus"] == [] and launch["log"] == "train.log"

    log = (run_dir / "train.log").read_text()
    assert "fake_trainer pid=%d" % pid in log and SECRET not in log
    (start,) = starts(runs_root)
    assert start["pid"] == pid
    # the trainer got the secret (by value) and only the environment it was given
    assert start["secret_sha"] == {"WANDB_API_KEY": hashlib.sha256(SECRET.encode()).hexdigest()}
    assert start["env"] == {"DFLASH_RUN_NAME": "r1", "HOME": None}
    assert SECRET not in json.dumps(res)


def test_relaunch_with_same_fingerprint_is_a_noop(runs_root):
    first = run_lifecycle.change(make_req(runs_root))
    again = run_lifecycle.change(make_req(runs_root))
    assert again["action"] == "noop" and again["changed"] is False
    assert again["pid"] == first["pid"] and again["same_config"] is True and again["stopped"] == []
    assert again["fingerprint"] == first["fingerprint"]
    started = run_lifecycle.change(make_req(runs_root, state="started", trainer_args={"interval": 0.05, "tag": "x"}))
    assert started["action"] == "noop" and started["changed"] is False  # started: alive is enough
    assert started["same_config"] is False
    assert len(starts(runs_root)) == 1 and procfs.is_alive(first["pid"])


def test_force_restarts_and_keeps_every_previous_log(runs_root):
    pids = [run_lifecycle.change(make_req(runs_root))["pid"]]
    for _ in range(2):  # quickly: likely the same second, so the same stamp
        res = run_lifecycle.change(make_req(runs_root, force=True))
        assert res["action"] == "launched" and res["changed"] is True
        assert [(s["run"], s["pid"], s["signal"]) for s in res["stopped"]] == [("r1", pids[-1], "SIGTERM")]
        assert not procfs.is_alive(pids[-1])
        assert len(res["kept"]) == 2 and all(os.path.exists(k) for k in res["kept"])
        pids.append(res["pid"])
    assert len(set(pids)) == 3 and read_pid(runs_root) == pids[-1]
    run_dir = runs_root / "r1"
    logs = sorted(p.name for p in run_dir.iterdir() if p.name.startswith("train."))
    assert len(logs) == 3 and "train.log" in logs
    kept = [n for n in logs if n != "train.log"]
    assert all(n.startswith("train.2") and n.endswith(".log") for n in kept)  # train.<stamp>[.N].log
    for pid in pids:  # each start's log is in exactly one file, with its SIGTERM checkpoint when it was stopped
        holders = [n for n in logs if "fake_trainer pid=%d " % pid in (run_dir / n).read_text()]
        assert len(holders) == 1
    assert "fake_trainer pid=%d " % pids[-1] in (run_dir / "train.log").read_text()
    assert len([p for p in run_dir.iterdir() if p.name.startswith("launch.")]) == 3


def test_stop_and_stop_of_a_stopped_run(runs_root):
    pid = run_lifecycle.change(make_req(runs_root))["pid"]
    res = run_lifecycle.change(make_req(runs_root, state="stopped"))
    assert res["action"] == "stopped" and res["changed"] is True and res["pid"] == pid
    assert [(s["run"], s["pid"], s["signal"]) for s in res["stopped"]] == [("r1", pid, "SIGTERM")]
    assert not procfs.is_alive(pid)
    assert json.loads((runs_root / "r1" / "heartbeat.json").read_text())["phase"] == "finished"
    again = run_lifecycle.change(make_req(runs_root, state="stopped"))
    assert again["action"] == "none" and again["changed"] is False and again["stopped"] == []


def test_stop_of_a_trainer_ignoring_sigterm_uses_sigkill(runs_root):
    pid = run_lifecycle.change(make_req(runs_root, trainer_args={"interval": 0.05, "ignore_term": True}))["pid"]
    res = run_lifecycle.change(make_req(runs_root, state="stopped", stop_timeout=0.3))
    (stop,) = res["stopped"]
    assert stop["signal"] == "SIGKILL" and stop["waited_s"] >= 0.3
    assert not procfs.is_alive(pid)


# --- check mode and diff ---------------------------------------------------------------------------------------

def test_check_mode_launches_nothing_and_lists_what_it_would_stop(runs_root):
    a = run_lifecycle.change(make_req(runs_root, name="a", gpus=[0]))["pid"]
    res = run_lifecycle.change(make_req(runs_root, name="b", gpus=[0, 1], check_mode=True))
    assert res["changed"] is True and res["action"] == "launched" and res["would_stop"] == ["a"]
    assert res["stopped"] == [] and "pid" not in res
    assert not (runs_root / "b").exists() and procfs.is_alive(a)
    fresh = run_lifecycle.change(make_req(runs_root, name="c", gpus=[2], check_mode=True))
    assert fresh["would_stop"] == [] and not (runs_root / "c").exists()
    stop = run_lifecycle.change(make_req(runs_root, name="a", state="stopped", check_mode=True))
    assert stop["changed"] is True and stop["action"] == "stopped" and stop["stopped"] == []
    assert procfs.is_alive(a) and len(starts(runs_root, "a")) == 1


def test_diff_of_a_restart_with_a_changed_trainer_arg(runs_root):
    old = make_req(runs_root, gpus=[0], secret_env={"WANDB_API_KEY": SECRET})
    pid = run_lifecycle.change(old)["pid"]
    new = make_req(runs_root, gpus=[0], secret_env={"WANDB_API_KEY": SECRET},
                   trainer_args={"interval": 0.05, "tag": "v2"}, diff=True)
    res = run_lifecycle.change(new)
    diff = res["diff"]
    before, after = diff["before"], diff["after"]
    assert res["action"] == "launched" and res["stopped"][0]["pid"] == pid
    assert before["alive"] is True and after["alive"] is True
    assert before["alive_on_its_gpus"] == ["r1"] and after["alive_on_its_gpus"] == ["r1"]
    assert before["fingerprint"] == old["fingerprint"] != after["fingerprint"] == new["fingerprint"]
    assert before["argv"] == old["argv"] and after["argv"] == new["argv"] and "--tag=v2" in after["argv"]
    assert before["secret_env_names"] == after["secret_env_names"] == ["WANDB_API_KEY"]
    assert before["gpus"] == after["gpus"] == [0]
    assert diff["before_header"] == diff["after_header"] == "run r1"
    assert SECRET not in json.dumps(diff)


def test_diff_of_a_noop_is_empty(runs_root):
    run_lifecycle.change(make_req(runs_root))
    res = run_lifecycle.change(make_req(runs_root, diff=True))
    assert res["action"] == "noop"
    assert res["diff"]["before"] == res["diff"]["after"]
    assert res["diff"]["before"]["alive"] is True


def test_diff_of_a_first_launch_and_of_a_stop(runs_root):
    req = make_req(runs_root, diff=True, gpus=[3])
    res = run_lifecycle.change(req)
    before, after = res["diff"]["before"], res["diff"]["after"]
    assert before["alive"] is False and before["fingerprint"] is None and before["alive_on_its_gpus"] == []
    assert after == dict(after, alive=True, alive_on_its_gpus=["r1"], fingerprint=req["fingerprint"], gpus=[3])
    stop = run_lifecycle.change(make_req(runs_root, state="stopped", diff=True, gpus=[3]))
    before, after = stop["diff"]["before"], stop["diff"]["after"]
    assert before["alive"] is True and before["fingerprint"] == req["fingerprint"]
    assert after["alive"] is False and after["alive_on_its_gpus"] == []
    again = run_lifecycle.change(make_req(runs_root, state="stopped", diff=True, gpus=[3]))
    assert again["diff"]["before"] == again["diff"]["after"] and again["diff"]["after"]["alive"] is False


def test_check_mode_diff_shows_the_runs_a_launch_would_stop(runs_root):
    run_lifecycle.change(make_req(runs_root, name="a", gpus=[0]))
    res = run_lifecycle.change(make_req(runs_root, name="b", gpus=[0, 1], check_mode=True, diff=True))
    assert res["diff"]["before"]["alive_on_its_gpus"] == ["a"]
    assert res["diff"]["after"]["alive_on_its_gpus"] == ["b"]


# --- runs sharing GPUs -----------------------------------------------------------------------------------------

def test_a_launch_stops_runs_sharing_a_gpu_and_only_those(runs_root):
    a = run_lifecycle.change(make_req(runs_root, name="a", gpus=[0]))["pid"]
    c = run_lifecycle.change(make_req(runs_root, name="c", gpus=[2]))["pid"]
    cpu = run_lifecycle.change(make_req(runs_root, name="cpu"))["pid"]  # no GPUs: never conflicts
    res = run_lifecycle.change(make_req(runs_root, name="b", gpus=[0, 1]))
    assert [(s["run"], s["pid"]) for s in res["stopped"]] == [("a", a)]
    assert not procfs.is_alive(a)
    assert procfs.is_alive(c) and procfs.is_alive(cpu) and procfs.is_alive(res["pid"])
    # and the other way round: c launching on [1, 2] stops b (GPU 1) and itself (a restart), not cpu
    res2 = run_lifecycle.change(make_req(runs_root, name="c", gpus=[1, 2], trainer_args={"interval": 0.05, "tag": "2"}))
    assert sorted((s["run"], s["pid"]) for s in res2["stopped"]) == sorted([("c", c), ("b", res["pid"])])
    assert procfs.is_alive(cpu)


def test_a_foreign_holder_of_a_gpu_device_file_blocks_the_launch(runs_root, tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia4").write_bytes(b"")
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1]); print('ready', flush=True);"
                               " time.sleep(60)", str(dev / "nvidia4")], stdout=subprocess.PIPE,
                              start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == b"ready"
        with pytest.raises(run_lifecycle.LifecycleError) as exc:
            run_lifecycle.change(make_req(runs_root, gpus=[3, 4], gpu_release_timeout=0.3))
        msg = str(exc.value)
        assert "pid %d" % holder.pid in msg and "nvidia4" in msg and "were not released within 0.3s" in msg
        assert exc.value.facts["stopped"] == [] and exc.value.facts["changed"] is False
        assert not (runs_root / "r1" / "pid").exists() and starts(runs_root) == []
        assert holder.poll() is None  # a process that is not a run is never stopped
    finally:
        holder.kill()
        holder.wait(5)
        holder.stdout.close()


# --- failures --------------------------------------------------------------------------------------------------

def test_a_crashing_trainer_fails_with_its_status_and_log_tail(runs_root, capsys):
    req = make_req(runs_root, trainer_args={"crash": 3})
    with pytest.raises(run_lifecycle.LifecycleError) as exc:
        run_lifecycle.change(req)
    assert "failed right after launch (exit 3)" in str(exc.value)
    facts = exc.value.facts
    assert facts["rc"] == 3 and any("crashing at start with status 3" in line for line in facts["log_tail"])
    assert "launch" in facts["timings"]
    out = run_main(make_req(runs_root, trainer_args={"crash": 4}), capsys)
    assert out["failed"] is True and out["rc"] == 4 and "failed right after launch (exit 4)" in out["msg"]
    assert any("status 4" in line for line in out["log_tail"])
    assert len(list((runs_root / "r1").glob("train.*.log"))) == 1  # the first crash's log was kept


def test_a_missing_trainer_executable_is_refused_before_the_live_run_is_stopped(runs_root):
    first = run_lifecycle.change(make_req(runs_root))
    with pytest.raises(run_lifecycle.LifecycleError) as exc:
        run_lifecycle.change(make_req(runs_root, force=True, command=[str(runs_root.parent / "no-such-trainer")]))
    assert exc.value.facts["rc"] == 127 and "no-such-trainer does not exist" in str(exc.value)
    assert "install_trainer.yml" in str(exc.value) and "nothing was stopped" in str(exc.value)
    assert procfs.is_alive(first["pid"]) and read_pid(runs_root) == first["pid"]
    assert sorted(p.name for p in (runs_root / "r1").glob("train*.log")) == ["train.log"]  # no log moved aside


def test_no_heartbeat_within_heartbeat_timeout_fails_naming_the_heartbeat(runs_root):
    req = make_req(runs_root, trainer_args={"interval": 0.05, "no_heartbeat": True}, heartbeat_timeout=0.4)
    t0 = time.monotonic()
    with pytest.raises(run_lifecycle.LifecycleError) as exc:
        run_lifecycle.change(req)
    assert 0.5 <= time.monotonic() - t0 < 5  # settle_time + heartbeat_timeout
    msg = str(exc.value)
    assert "heartbeat" in msg and "within 0.4s" in msg
    pid = exc.value.facts["pid"]
    assert pid == read_pid(runs_root)
    assert not (runs_root / "r1" / "heartbeat.json").exists()
    # A launch that failed its proof does not live on as an unverified run.
    assert "the new process (pid %d) was stopped with SIGTERM" % pid in msg
    wait_dead(pid)


def test_a_stale_heartbeat_of_an_earlier_launch_is_never_reported_as_the_run(runs_root):
    first = run_lifecycle.change(make_req(runs_root))["pid"]
    run_lifecycle.change(make_req(runs_root, state="stopped"))
    assert json.loads((runs_root / "r1" / "heartbeat.json").read_text())["pid"] == first  # left behind
    with pytest.raises(run_lifecycle.LifecycleError):
        run_lifecycle.change(make_req(runs_root, trainer_args={"interval": 0.05, "crash": 4}))
    status = run_status.status(make_req(runs_root, state="status"))
    assert status["phase"] == "dead" and status["heartbeat"] is None and "step" not in status


def test_kept_logs_of_the_same_second_keep_the_log_extension(runs_root):
    run_dir = runs_root / "r1"
    run_dir.mkdir(parents=True)
    taken = run_dir / "train.20261130-101500.log"
    taken.write_text("older")
    assert run_records.unique_path(str(taken)) == str(run_dir / "train.20261130-101500.1.log")


def test_wait_for_phase_that_never_comes_fails_after_phase_timeout(runs_root):
    with pytest.raises(run_lifecycle.LifecycleError) as exc:
        run_lifecycle.change(make_req(runs_root, wait_for_phase="loading", phase_timeout=0.3))
    assert "did not reach phase loading within 0.3s" in str(exc.value)
    assert exc.value.facts["heartbeat"]["phase"] in ("training", "checkpointing")
    res = run_lifecycle.change(make_req(runs_root, wait_for_phase="training", force=True))
    assert res["phase"] == "training"


# --- the lock --------------------------------------------------------------------------------------------------

def test_a_held_lock_makes_change_time_out_and_a_failure_releases_it(runs_root):
    runs_root.mkdir()
    fd = os.open(str(runs_root / run_lifecycle.LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        t0 = time.monotonic()
        with pytest.raises(run_lifecycle.LifecycleError) as exc:
            run_lifecycle.change(make_req(runs_root, lock_timeout=0.3))
        assert 0.3 <= time.monotonic() - t0 < 3
        assert "another restart/stop" in str(exc.value) and "lock_timeout" in str(exc.value)
        assert not (runs_root / "r1").exists()
        fcntl.flock(fd, fcntl.LOCK_UN)
        # a failed change (crash) leaves the lock free again
        with pytest.raises(run_lifecycle.LifecycleError):
            run_lifecycle.change(make_req(runs_root, trainer_args={"crash": 1}, lock_timeout=0.3))
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # would raise BlockingIOError if still held
        fcntl.flock(fd, fcntl.LOCK_UN)
        fcntl.flock(fd, fcntl.LOCK_SH)  # even a shared holder excludes a change: the lock is exclusive
        with pytest.raises(run_lifecycle.LifecycleError) as exc:
            run_lifecycle.change(make_req(runs_root, lock_timeout=0.1))
        assert "another restart/stop" in str(exc.value)
    finally:
        os.close(fd)


def test_the_lock_is_held_through_verification(runs_root):
    """A concurrent change (another run on the same GPU) cannot stop a launch before it is proven live."""
    results = {}

    def restart_a():
        try:
            results["a"] = run_lifecycle.change(make_req(runs_root, name="a", gpus=[0], settle_time=0.8))
        except Exception as exc:  # reported below
            results["a"] = exc

    thread = threading.Thread(target=restart_a)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while not (runs_root / "a" / "pid").exists():  # a holds the lock and has launched; now verifying
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(run_lifecycle.LifecycleError) as exc:
            run_lifecycle.change(make_req(runs_root, name="b", gpus=[0], lock_timeout=0.2))
        assert "another restart/stop" in str(exc.value)
    finally:
        thread.join(10)
    assert results["a"]["action"] == "launched" and procfs.is_alive(results["a"]["pid"])
    assert not (runs_root / "b").exists()


# --- main() ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["a\n", "../x", "..", ".", "", "a/b", "x" * 65, None, 5])
def test_main_refuses_an_invalid_run_name_and_touches_nothing(tmp_path, runs_root, capsys, bad):
    req = make_req(runs_root)
    req.update(run=bad, run_dir=os.path.join(str(runs_root), str(bad)))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    out = run_main(req, capsys)
    assert out["failed"] is True and "invalid run name" in out["msg"] and "\n" not in out["msg"]
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    status = dict(req, action="status")
    assert run_main(status, capsys)["failed"] is True


def test_main_reports_unexpected_errors_as_one_failed_line(runs_root, capsys):
    req = make_req(runs_root)
    del req["argv"]
    out = run_main(req, capsys)
    assert out["failed"] is True and out["msg"].startswith("lifecycle error: KeyError")


def test_main_success_prints_the_result(runs_root, capsys):
    out = run_main(make_req(runs_root), capsys)
    assert "failed" not in out and out["action"] == "launched" and out["pid"] == read_pid(runs_root)
    assert run_main(make_req(runs_root, state="status"), capsys)["alive"] is True


# --- status ----------------------------------------------------------------------------------------------------

def test_status_of_a_never_launched_run(runs_root):
    st = run_status.status(make_req(runs_root, state="status", status_log_lines=5))
    assert st["phase"] == "never launched" and st["alive"] is False and st["launched"] is False
    assert st["pid"] is None and st["heartbeat"] is None and st["fingerprint"] is None and st["log_tail"] == []
    assert st["gpu_memory"] is None and st["gpu_memory_note"] == "no GPUs configured for this run"
    assert not runs_root.exists()  # status writes nothing


def test_status_of_a_live_then_dead_run(runs_root):
    req = make_req(runs_root)
    pid = run_lifecycle.change(req)["pid"]
    st = run_status.status(make_req(runs_root, state="status", status_log_lines=3))
    assert st["alive"] is True and st["pid"] == pid and st["launched"] is True
    assert st["phase"] in ("training", "checkpointing") and st["fingerprint"] == req["fingerprint"]
    assert 0 <= st["heartbeat_age_s"] < 5 and st["heartbeat"]["pid"] == pid
    assert len(st["log_tail"]) <= 3 and any("fake_trainer pid=%d" % pid in line for line in st["log_tail"])
    os.killpg(pid, signal.SIGKILL)  # killed without a chance to write a last heartbeat (our child: a zombie now)
    wait_dead(pid)
    hb = json.loads((runs_root / "r1" / "heartbeat.json").read_text())
    st = run_status.status(make_req(runs_root, state="status"))
    assert st["alive"] is False and st["pid"] is None and st["launched"] is True
    assert st["phase"] == "dead" and st["dead_since"] == hb["updated_at"]
    assert st["log_tail"] == []  # status_log_lines 0


def test_status_of_a_cleanly_stopped_run_says_finished(runs_root):
    run_lifecycle.change(make_req(runs_root))
    run_lifecycle.change(make_req(runs_root, state="stopped"))
    st = run_status.status(make_req(runs_root, state="status"))
    assert st["alive"] is False and st["phase"] == "finished" and "dead_since" not in st


def test_a_reused_pid_is_not_the_run_and_is_never_stopped(runs_root):
    pid = run_lifecycle.change(make_req(runs_root))["pid"]
    os.killpg(pid, signal.SIGKILL)
    wait_dead(pid)
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (runs_root / "r1" / "pid").write_text("%d\n" % stranger.pid)  # as if the pid had been reused
        st = run_status.status(make_req(runs_root, state="status"))
        assert st["alive"] is False and st["phase"] == "dead"
        res = run_lifecycle.change(make_req(runs_root))
        assert res["action"] == "launched" and res["stopped"] == []
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait(5)


def test_log_tail_reads_the_last_lines(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(100000)) + "GLHF! 🏖️ café\x07.\n".encode()
                     + b"\xff\xfe last")
    # plain ASCII (issue 37: gloo's emoji made Ansible print the whole summary as one escaped string)
    assert run_status.log_tail(str(path), 3) == ["line 99999", "GLHF!  cafe .", " last"]
    assert run_status.log_tail(str(tmp_path / "absent.log"), 3) == []


# --- check mode creates nothing; system directories and the run directory (issue 20, item 5) -------------------

def test_check_mode_creates_no_runs_root_and_no_lock_file(runs_root):
    for state in ("restarted", "started", "stopped"):
        res = run_lifecycle.change(make_req(runs_root, state=state, check_mode=True))
        assert res["changed"] is (state != "stopped")
        assert not runs_root.exists(), state
    runs_root.mkdir()
    res = run_lifecycle.change(make_req(runs_root, check_mode=True))
    assert res["action"] == "launched" and res["changed"]
    assert os.listdir(str(runs_root)) == []  # no lock file, no run directory


def test_a_runs_root_linked_to_a_system_directory_is_refused_in_the_container(tmp_path, capsys):
    link = tmp_path / "runs"
    link.symlink_to("/etc")
    out = run_main(make_req(link), capsys)
    assert out["failed"] and out["msg"] == ("runs_root %s (-> /etc) is a system directory; give the runs a directory "
                                            "of their own (e.g. dflash_runs_root=/workspace/runs)" % link)
    assert not os.path.exists("/etc/r1") and not os.path.exists("/etc/" + run_lifecycle.LOCK_NAME)


def test_reserved_env_is_refused_in_the_container_too(runs_root, capsys):
    req = make_req(runs_root)
    req["env"] = {"DFLASH_RUN_DIR": "/etc"}
    out = run_main(req, capsys)
    assert out["failed"] and out["msg"].startswith("the run's env sets DFLASH_RUN_DIR")
    assert not runs_root.exists()


# --- precise states in stop and status (issue 20, item 4) -------------------------------------------------------

def _state(runs_root, name="r1"):
    return run_status.status(make_req(runs_root, name=name, state="status"))["state"]


def test_stop_and_status_of_a_run_never_launched(runs_root):
    res = run_lifecycle.change(make_req(runs_root, state="stopped"))
    assert res["changed"] is False and res["action"] == "none"
    assert res["state"] == "not running (never launched)" == _state(runs_root)


def test_a_run_stopped_by_sigterm_says_at_which_step_it_checkpointed(runs_root):
    pid = run_lifecycle.change(make_req(runs_root))["pid"]
    assert _state(runs_root) == "running"
    time.sleep(0.3)
    stop = run_lifecycle.change(make_req(runs_root, state="stopped"))
    assert stop["changed"] and stop["stopped"][0]["signal"] == "SIGTERM"
    step = json.loads((runs_root / "r1" / "heartbeat.json").read_text())["step"]
    assert step > 0
    want = "not running (stopped by SIGTERM at step %d, checkpointed)" % step
    assert _state(runs_root) == want
    again = run_lifecycle.change(make_req(runs_root, state="stopped"))
    assert again["changed"] is False and again["action"] == "none" and again["state"] == want
    assert not procfs.is_alive(pid)


def test_a_trainer_deaf_to_sigterm_is_reported_as_killed_before_it_checkpointed(runs_root):
    run_lifecycle.change(make_req(runs_root, trainer_args={"interval": 0.05, "ignore_term": True}, stop_timeout=0.3))
    stop = run_lifecycle.change(make_req(runs_root, state="stopped", stop_timeout=0.3))
    assert stop["stopped"][0]["signal"] == "SIGKILL"
    assert _state(runs_root).startswith("not running (stopped by SIGKILL after ")
    assert _state(runs_root).endswith(", before the trainer checkpointed)")


def test_a_crash_at_launch_is_reported_with_its_exit_status(runs_root, capsys):
    out = run_main(make_req(runs_root, trainer_args={"crash": 3}), capsys)
    assert out["failed"] and out["rc"] == 3
    assert _state(runs_root) == "crashed (exit 3)"


def test_a_trainer_killed_behind_our_back_is_crashed_with_its_last_heartbeat(runs_root):
    pid = run_lifecycle.change(make_req(runs_root))["pid"]
    os.killpg(pid, signal.SIGKILL)
    wait_dead(pid)
    state = _state(runs_root)
    assert state.startswith("crashed (exit status not recorded: the process is gone; last heartbeat: phase ")
    assert " UTC)" in state


# --- GPU indexes without NVML: their device files (issue 20, item 2) ----------------------------------------------

def test_a_gpu_without_its_device_file_is_refused_before_anything_is_stopped(runs_root, capsys):
    live = run_lifecycle.change(make_req(runs_root, name="a", gpus=[0]))["pid"]
    req = make_req(runs_root, name="a", gpus=[0, 99], devices=False, force=True, trainer_args={"tag": "x"})
    out = run_main(req, capsys)
    dev = req["gpu_device_pattern"].format(index=99)
    assert out["failed"] and out["msg"].startswith(
        "GPU 99 does not exist here: no device file %s, and NVML is unusable (" % dev)
    assert out["msg"].endswith("); fix the run's GPU lists (dflash_target_gpus / dflash_drafter_gpus), or the "
                               "driver") and "\n" not in out["msg"]
    assert procfs.is_alive(live) and read_pid(runs_root, "a") == live and len(starts(runs_root, "a")) == 1


# --- disk space: preflight before anything is stopped; failures after a stop (issue 20, item 1) ------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) → a tmpfs of that size under tmp_path; trainers started there are killed, then it is unmounted."""
    mounts = []

    def mount(size, name="disk"):
        path = tmp_path / name
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", str(path)], check=True)
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        for starts_file in path.glob("**/starts.jsonl"):
            for line in starts_file.read_text().splitlines():
                pid = json.loads(line)["pid"]
                if procfs.is_alive(pid) and FAKE in (procfs.cmdline(pid) or []):
                    procfs.stop_group(pid, 0)
        subprocess.run(["umount", "-l", str(path)], check=True)


def _fill(path, leave=0):
    """Write a filler file under path until the filesystem has at most `leave` bytes free."""
    with open(os.path.join(str(path), "filler"), "ab") as f:
        for chunk in (1 << 20, 1 << 16, 4096, 512, 1):
            while True:
                st = os.statvfs(str(path))
                if st.f_bavail * st.f_frsize - chunk < leave:
                    break
                try:
                    f.write(b"\0" * chunk)
                    f.flush()
                except OSError:
                    break


def _temp_files(root, live_pid=None):
    """Temp files an operation left; a live trainer's heartbeat being written (every 0.05 s) is not one of them."""
    own = "heartbeat.json.tmp.%d" % live_pid if live_pid else None
    return [p for p in root.rglob("*") if ".tmp" in p.name and p.name != own]


@needs_root
def test_a_restart_without_room_is_refused_before_the_live_run_is_stopped(small_disk):
    runs = small_disk("8m") / "runs"
    args = {"interval": 0.05, "ckpt_every": 100000, "keep_checkpoints": 1}
    run_lifecycle.change(make_req(runs, trainer_args=args))
    run_lifecycle.change(make_req(runs, state="stopped"))
    ckpt = runs / "r1" / "checkpoints" / (runs / "r1" / "checkpoints" / "latest").read_text().strip()
    (ckpt / "weights.bin").write_bytes(b"\1" * (2 << 20))  # the newest checkpoint now weighs 2 MiB
    live = run_lifecycle.change(make_req(runs, trainer_args=args))["pid"]  # 1 MiB + 2 MiB needed, ~6 MiB free
    _fill(runs, leave=2 << 20)
    before = (runs / "r1" / "launch.json").read_text()
    with pytest.raises(run_lifecycle.LifecycleError) as exc:
        run_lifecycle.change(make_req(runs, trainer_args=dict(args, tag="new"), force=True))
    msg = str(exc.value)
    assert msg.startswith("not enough disk space in %s: " % (runs / "r1")), msg
    free, needed = [int(x) for x in re.findall(r": (\d+) bytes free .* (\d+) needed \(", msg)[0]]
    assert free < needed and needed >= (3 << 20)
    assert "(launch 1048576 + 1 checkpoint of " in msg and "estimated from %s (keep_checkpoints 1 + 1)" % ckpt in msg
    assert msg.endswith("; nothing was stopped") and "\n" not in msg
    assert procfs.is_alive(live) and read_pid(runs) == live
    assert (runs / "r1" / "launch.json").read_text() == before
    assert _temp_files(runs, live_pid=live) == []  # (it once caught the live run's heartbeat mid-write)


@needs_root
def test_the_checkpoint_directory_on_another_disk_is_checked_too(small_disk, runs_root):
    out = small_disk("4m", "ckpt")
    step = out / "checkpoints" / "step-7"
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"\1" * (1536 << 10))
    (out / "checkpoints" / "latest").write_text("step-7")
    with pytest.raises(run_lifecycle.LifecycleError) as exc:
        run_lifecycle.change(make_req(runs_root, trainer_args={"interval": 0.05, "output_dir": str(out),
                                                               "keep_checkpoints": 3}))
    msg = str(exc.value)
    assert msg.startswith("not enough disk space in %s: " % (out / "checkpoints")), msg
    assert "3 checkpoints of " in msg and "estimated from %s (keep_checkpoints 3 + 1)" % step in msg
    assert not (runs_root / "r1").exists()


@needs_root
def test_a_full_disk_after_the_stop_says_the_run_was_stopped_and_where_its_checkpoint_is(small_disk):
    runs = small_disk("8m") / "runs"
    dev = runs.parent / "dev" / "nvidia0"  # make_req's stand-in device file (make_req creates it)
    first = run_lifecycle.change(make_req(runs, gpus=[0], trainer_args={"interval": 0.05, "ckpt_every": 100000}))
    before = (runs / "r1" / "launch.json").read_text()
    # A stray holder of the GPU keeps the lifecycle waiting after the stop; meanwhile the disk fills up.
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1]); print('ready', flush=True);"
                               " time.sleep(60)", str(dev)], stdout=subprocess.PIPE)

    def fill_then_release():
        wait_dead(first["pid"], timeout=20)
        record = runs / "r1" / run_records.STOP_RECORD
        deadline = time.monotonic() + 20  # the lifecycle records its stop right after it: let it land first
        while not (record.exists() and json.loads(record.read_text() or "{}").get("pid") == first["pid"]):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        _fill(runs)
        holder.kill()

    filler = threading.Thread(target=fill_then_release)
    try:
        assert holder.stdout.readline().strip() == b"ready"  # it holds the device before the restart looks
        filler.start()
        with pytest.raises(run_lifecycle.LifecycleError) as exc:
            run_lifecycle.change(make_req(runs, gpus=[0], force=True, gpu_release_timeout=20,
                                          trainer_args={"interval": 0.05, "ckpt_every": 100000, "tag": "new"}))
    finally:
        filler.join()
        holder.kill()
        holder.wait()
        holder.stdout.close()
    msg = str(exc.value)
    ckpt = runs / "r1" / "checkpoints" / (runs / "r1" / "checkpoints" / "latest").read_text().strip()
    assert msg.startswith("could not write %s: No space left on device; " % (runs / "r1" / "launch.json")), msg
    assert msg.endswith("the previous run r1 (pid %d) was stopped (SIGTERM) before this failure; its last "
                        "checkpoint is %s" % (first["pid"], ckpt)), msg
    assert exc.value.facts["stopped"][0]["run"] == "r1" and exc.value.facts["changed"] is True
    assert _temp_files(runs) == []
    assert (runs / "r1" / "launch.json").read_text() == before  # the previous launch stays the record
    os.unlink(str(runs / "filler"))
    assert _state(runs).startswith("not running (stopped by SIGTERM at step ")


# --- growth: earlier logs and launch records pruned to the newest N (issue 20, item 6) ----------------------------

def test_a_launch_keeps_the_newest_records_and_never_touches_checkpoints(runs_root):
    run_dir = runs_root / "r1"
    (run_dir / "checkpoints" / "step-4").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-4" / "train.20200101-000000.log").write_text("a checkpoint's file")
    (run_dir / "checkpoints" / "step-4" / "state.json").write_text('{"step": 4}')
    (run_dir / "checkpoints" / "latest").write_text("step-4")
    for day in range(1, 26):
        (run_dir / ("train.202001%02d-120000.log" % day)).write_text("log %d" % day)
        (run_dir / ("launch.202001%02d-120000.json" % day)).write_text("{}")
    (run_dir / "train.20200125-120000.1.log").write_text("same second, later")
    (run_dir / "notes.txt").write_text("the operator's")
    res = run_lifecycle.change(make_req(runs_root, keep_records=3))
    assert res["action"] == "launched"
    logs = sorted(p.name for p in run_dir.glob("train.*.log"))
    launches = sorted(p.name for p in run_dir.glob("launch.*.json"))
    assert logs == ["train.20200124-120000.log", "train.20200125-120000.1.log", "train.20200125-120000.log"]
    assert launches == ["launch.20200123-120000.json", "launch.20200124-120000.json", "launch.20200125-120000.json"]
    assert (run_dir / "checkpoints" / "step-4" / "train.20200101-000000.log").exists()
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-4" and (run_dir / "notes.txt").exists()
    assert (run_dir / "launch.json").exists() and (run_dir / "train.log").exists()


def test_restarts_keep_at_most_n_records_each(runs_root):
    for tag in "abcde":
        run_lifecycle.change(make_req(runs_root, keep_records=2, trainer_args={"interval": 0.05, "tag": tag}))
    run_dir = runs_root / "r1"
    assert len(list(run_dir.glob("train.*.log"))) == 2 and len(list(run_dir.glob("launch.*.json"))) == 2
    assert len(starts(runs_root)) == 5  # five launches; their records beyond the newest two are gone


def test_keep_records_below_zero_is_refused():
    with pytest.raises(ValueError, match="^keep_records must be 0 or more"):
        make_req(__import__("pathlib").Path("/tmp/x/runs"), keep_records=-1)


# --- the trainer's check before anything is stopped (issue 30) ----------------------------------------------------

def _heartbeat_step(runs_root):
    return json.loads((runs_root / "r1" / "heartbeat.json").read_text())["step"]


def _untouched(runs_root, pid, launch_before, logs_before):
    """The live run goes on: same pid, step still advancing, launch.json and the logs as they were."""
    step = _heartbeat_step(runs_root)
    deadline = time.monotonic() + 5
    while _heartbeat_step(runs_root) <= step:
        assert time.monotonic() < deadline, "the live run stopped stepping"
        time.sleep(0.05)
    assert procfs.is_alive(pid) and read_pid(runs_root) == pid
    assert (runs_root / "r1" / "launch.json").read_text() == launch_before
    assert sorted(p.name for p in (runs_root / "r1").glob("*.log")) == logs_before
    assert len(starts(runs_root)) == 1


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_configuration_the_trainer_refuses_never_stops_the_live_run(runs_root, check_mode):
    pid = run_lifecycle.change(make_req(runs_root))["pid"]
    launch_before = (runs_root / "r1" / "launch.json").read_text()
    logs_before = sorted(p.name for p in (runs_root / "r1").glob("*.log"))
    refused = make_req(runs_root, check_mode=check_mode,
                       trainer_args={"interval": 0.05, "refuse_check": "--blok-size: did you mean --block-size?"})
    with pytest.raises(run_lifecycle.LifecycleError) as exc:
        run_lifecycle.change(refused)
    assert str(exc.value) == ("the trainer's check refused this configuration, so nothing was stopped (r1 (pid %d) "
                              "still running): --blok-size: did you mean --block-size?" % pid)
    _untouched(runs_root, pid, launch_before, logs_before)


def test_check_mode_says_would_launch_only_after_the_trainer_check_passes(runs_root):
    result = run_lifecycle.change(make_req(runs_root, check_mode=True))
    assert result["action"] == "launched" and result["changed"] and not (runs_root / "r1").exists()


def test_the_check_runs_the_command_with_check_first_and_without_secrets(runs_root, tmp_path):
    req = make_req(runs_root, trainer_args={"interval": 0.05, "output_dir": str(tmp_path / "out"),
                                            "keep_checkpoints": 5}, secret_env={"WANDB_API_KEY": SECRET})
    assert req["check_argv"][:3] == [sys.executable, FAKE, "--check"]
    settings = run_launch.trainer_check(req)
    assert settings["checkpoints"] == str(tmp_path / "out" / "checkpoints") and settings["keep_checkpoints"] == 5
    env = run_launch.launch_env(req, secrets=False)
    assert "WANDB_API_KEY" not in env and env["DFLASH_RUN_DIR"] == req["run_dir"]


def test_a_command_that_does_not_answer_the_check_is_refused_with_its_last_lines(runs_root):
    req = make_req(runs_root, command=[sys.executable, "-c", "import sys; sys.exit('no such flag: --check')"])
    with pytest.raises(run_lifecycle.LifecycleError) as exc:
        run_lifecycle.change(req)
    assert str(exc.value).endswith(": no such flag: --check; the installed trainer has no --check: run "
                                   "playbooks/install_trainer.yml")
    assert not (runs_root / "r1" / "launch.json").exists()


def test_a_launch_that_dies_after_the_stop_names_the_trainers_error_line(runs_root):
    with pytest.raises(run_lifecycle.LifecycleError) as exc:
        run_lifecycle.change(make_req(runs_root, trainer_args={"crash": 3}))
    assert str(exc.value).startswith("the trainer failed right after launch (exit 3): fake_trainer: crashing "
                                      "at start with status 3 (as asked); see log_tail (")


def test_the_same_bad_launch_has_one_wording_whatever_is_seen_first(runs_root):
    """A trainer that fails at start writes its `failed` heartbeat and exits 2: whether the lifecycle sees the exit
    first (it follows at once) or the heartbeat first (the exit comes 1 s later), the line is the same, plain text."""
    lines = []
    for after in (0.0, 1.0):
        req = make_req(runs_root, trainer_args={"fail": "the data dir /d is empty 🏖️\x07; give one",
                                                "fail_exit_after": after})
        with pytest.raises(run_lifecycle.LifecycleError) as exc:
            run_lifecycle.change(req)
        assert exc.value.facts["rc"] == 2
        lines.append(str(exc.value))
    assert lines[0] == lines[1], lines
    assert lines[0].startswith("the trainer failed right after launch (exit 2): the data dir /d is empty ; give "
                               "one; see log_tail ("), lines[0]
    assert lines[0].isascii()
