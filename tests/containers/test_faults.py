"""Fault matrix of dflash.ops.training_run through the real chain: ansible-playbook -> ssh -tt -> pct -> lxc-attach.

Each test asserts the outcome and that nothing is lost. The trainer is the stdlib stand-in
tests/harness/fake_trainer.py (honours the run contract, fault switches) -- except test_real_trainer.py.
"""
import json
import subprocess
import threading
import time

from pathlib import Path

import pytest

from harness import lxc
from harness.fixtures import FAKE_TRAINER_CT, run_playbook
from harness.sshd import Sshd
from harness.waiting import wait_for

PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"

pytestmark = pytest.mark.containers
PLAY = PLAYBOOKS / "training_run.yml"
RUNS = "/workspace/runs"
FAKE = ["python3", FAKE_TRAINER_CT]
FAST = {"settle_time": 0.5, "heartbeat_timeout": 20, "stop_timeout": 10, "gpu_release_timeout": 5}


def tr(play, name, **opts):
    args = {"name": name, "command": FAKE, **FAST, **opts}
    return play(PLAY, {"tr": args})


def launched(r):
    res = r.task("Training run")
    assert r.outcome("Training run") == "ok", (res, r.stdout[-3000:])
    assert res["action"] == "launched", res
    return res


def failed(r):
    res = r.task("Training run")
    assert r.outcome("Training run") == "failed", (res, r.stdout[-3000:])
    return res


def stopped(res):
    """{pid: signal} of the runs stopped first (the module's `stopped: [{run, pid, pgid, signal, waited_s}]`)."""
    return {s["pid"]: s["signal"] for s in res["stopped"]}


def one_line(msg):
    assert msg and "\n" not in msg.strip(), f"error is not one line: {msg!r}"
    return msg


def snapshot(ct, run):
    """{relative path: content} of the run dir's checkpoints and logs."""
    p = ct.sh(f"cd {RUNS}/{run} && for f in $(find . -type f \\( -path './checkpoints/*' -o -name 'train*.log*' \\) "
              f"| sort); do printf '%s\\0' \"$f\"; cat \"$f\"; printf '\\0'; done", check=False)
    parts = p.stdout.split("\0")
    return dict(zip(parts[0::2], parts[1::2]))


def assert_kept(before, after):
    """Every checkpoint file is still there unchanged; every old log's content is still in some log file."""
    for path, content in before.items():
        if "/.tmp-" in path:
            continue  # a checkpoint being written when the snapshot was taken: not a checkpoint yet
        if "/checkpoints/" in path and "latest" not in path:
            assert after.get(path) == content, f"checkpoint {path} lost or changed"
        elif "train" in path:
            assert any(c.startswith(content) for p, c in after.items() if "train" in p), f"log {path} lost"


# --- container / host faults ---------------------------------------------------------------------------------

def test_container_stopped(play, ct200):
    lxc.stop("200", kill=True)
    r = tr(play, "stopped-ct")
    res = failed(r)
    msg = one_line(res["msg"])
    assert "200" in msg and "pct start 200" in msg, msg
    lxc.start("200")
    lxc.wait_ready("200")
    assert ct200.pids("fake_trainer") == []
    assert ct200.read(f"{RUNS}/stopped-ct/pid") is None


def test_pct_missing_on_host(ct200, harness_env, tmp_path):
    s = Sshd(tmp_path / "sshd-nopct", with_pct=False).start()
    try:
        assert s.ssh("command -v pct").returncode != 0
        env = dict(harness_env, **s.env())
        r = run_playbook(env, PLAY, {"tr": {"name": "nopct", "command": FAKE, **FAST}})
        res = failed(r)
        msg = one_line(res["msg"])
        assert "pct" in msg and "not found" in msg, msg
    finally:
        s.stop()
    assert ct200.pids("fake_trainer") == []


def test_hostile_container_exec_path(play, ct200):
    """pct_path pointing nowhere: refused in one line, nothing launched."""
    res = failed(tr(play, "badpct", pct_path="/nonexistent/pct"))
    one_line(res["msg"])
    assert ct200.pids("fake_trainer") == []


# --- trainer faults ------------------------------------------------------------------------------------------

def _good_run(play, ct, run, **args):
    res = launched(tr(play, run, trainer_args={"interval": 0.1, "ckpt_every": 2, **args}))
    wait_for(lambda: ct.read(f"{RUNS}/{run}/checkpoints/latest"), what="a checkpoint")
    return res


def test_trainer_binary_missing_keeps_previous_run(play, ct200):
    first = _good_run(play, ct200, "keep")
    r = tr(play, "keep", command=["/opt/nope/dflash-train"], force=True)
    res = failed(r)
    assert res.get("rc") == 127, res
    assert "/opt/nope/dflash-train does not exist" in res["msg"] and "nothing was stopped" in res["msg"], res
    # refused before the stop: the previous run is still the one running
    assert ct200.pids("fake_trainer") == [first["pid"]]
    logs = [f for f in ct200.sh(f"ls {RUNS}/keep").stdout.split() if f.startswith("train")]
    assert logs == ["train.log"], logs  # nothing was moved aside for a launch


def test_trainer_crashes_at_start(play, ct200):
    _good_run(play, ct200, "crash")
    before = snapshot(ct200, "crash")
    r = tr(play, "crash", trainer_args={"crash": 3})
    res = failed(r)
    assert res.get("rc") == 3, res
    tail = res.get("log_tail")
    tail = "\n".join(tail) if isinstance(tail, list) else str(tail)
    assert "crashing at start with status 3" in tail, tail
    one_line(res["msg"])
    assert_kept(before, snapshot(ct200, "crash"))


def test_old_process_ignores_sigterm(play, ct200):
    old = launched(tr(play, "stubborn", trainer_args={"ignore_term": True}))
    r = tr(play, "stubborn", stop_timeout=2, trainer_args={"tag": "new"})
    res = launched(r)
    assert stopped(res) == {old["pid"]: "SIGKILL"}, res
    assert res["timings"]["stop"] >= 2, res["timings"]
    assert ct200.pids("fake_trainer") == [res["pid"]]
    # the old one never got to its SIGTERM handler (it ignores SIGTERM): it was SIGKILLed after the grace period
    logs = ct200.sh(f"cat {RUNS}/stubborn/train*.log*", check=False).stdout
    assert "SIGTERM at step" not in logs


def test_old_process_exits_slowly_is_waited_for(play, ct200):
    old = launched(tr(play, "slow", trainer_args={"slow_exit": 3}))
    r = tr(play, "slow", stop_timeout=30, trainer_args={"tag": "new"})
    res = launched(r)
    assert stopped(res) == {old["pid"]: "SIGTERM"}, res
    assert 3 <= res["timings"]["stop"] < 30, res["timings"]
    logs = ct200.sh(f"cat {RUNS}/slow/train*.log*", check=False).stdout
    assert "fake_trainer: exiting" in logs, "the slow old process was killed before it finished"
    assert ct200.pids("fake_trainer") == [res["pid"]]


def test_stray_process_holds_the_gpu(play, ct200):
    ct200.sh("touch /tmp/fakegpu0 && setsid -f python3 -c 'import time; f=open(\"/tmp/fakegpu0\"); time.sleep(600)' "
             ">/dev/null 2>&1 </dev/null")
    stray = wait_for(lambda: ct200.pids("fakegpu0"), what="the stray holder")
    assert len(stray) == 1
    r = tr(play, "gpu", gpus=[0], gpu_device_pattern="/tmp/fakegpu{index}", gpu_release_timeout=2)
    res = failed(r)
    msg = one_line(res["msg"])
    assert str(stray[0]) in msg, msg
    assert ct200.pids("fake_trainer") == []
    assert ct200.read(f"{RUNS}/gpu/pid") is None
    assert ct200.pids("fakegpu0") == stray  # a stray that is not a run is never killed


def test_concurrent_restarts_are_serialized(play, ct200):
    results = {}

    def go(run):
        results[run] = tr(play, run, gpus=[0], gpu_device_pattern="/tmp/fakegpu{index}")

    ct200.sh("touch /tmp/fakegpu0")
    threads = [threading.Thread(target=go, args=(n,)) for n in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pids = {n: launched(r)["pid"] for n, r in results.items()}
    time.sleep(0.5)
    alive = ct200.pids("fake_trainer")
    print(f"\nconcurrent restarts: launched {pids}, alive after {alive}, lock waits "
          f"{[results[n].task('Training run')['timings'].get('lock') for n in results]}")
    assert len(alive) == 1 and alive[0] in pids.values()
    winner = next(n for n, p in pids.items() if p == alive[0])
    loser = next(n for n in pids if n != winner)
    # serialized: the later restart saw the earlier run and stopped it (they share GPU 0)
    assert pids[loser] in stopped(results[winner].task("Training run")), results[winner].task("Training run")


def launched_pid(ct, run):
    """The run's pid once its pid file names a live trainer process, else None."""
    text = ct.read(f"{RUNS}/{run}/pid")
    pid = int(text.strip()) if text and text.strip().isdigit() else None
    return pid if pid in ct.pids("fake_trainer") else None


def test_ssh_drop_after_launch_keeps_the_run(harness_env, sshd, ct200):
    args = {"name": "dropped", "command": FAKE, **FAST, "settle_time": 5}
    cmd = ["ansible-playbook", "-i", str(PLAYBOOKS.parents[2] / "inventories/harness/hosts.yml"), str(PLAY),
           "-e", json.dumps({"tr": args})]
    p = subprocess.Popen(cmd, env=harness_env, cwd=str(PLAYBOOKS.parents[2]), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        # The launched run's process (its pid file names it), not the trainer's check that runs before the launch
        pid = wait_for(lambda: launched_pid(ct200, "dropped"), timeout=60, what="the launch")
        kids = sshd.children()
        assert kids, "no ssh session to drop"
        for k in kids:  # drop the connection: kill the sshd session processes (ours, by pid)
            subprocess.run(["kill", "-KILL", str(k)])
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode != 0, out[-2000:]  # the play saw the drop
    time.sleep(1)
    assert ct200.pids("fake_trainer") == [pid], "the run died with the ssh session"
    r = run_playbook(harness_env, PLAY, {"tr": {"name": "dropped", "state": "status"}})
    st = r.task("Training run")
    assert st["alive"] is True and st["pid"] == pid, st


def test_container_restart_reports_dead_run(play, sshd, ct200):
    launched(tr(play, "reboot"))
    time.sleep(1.5)
    alive_at = ct200.read_json(f"{RUNS}/reboot/heartbeat.json")["updated_at"]
    assert sshd.ssh("pct stop 200").returncode == 0
    assert sshd.ssh("pct start 200").returncode == 0
    lxc.wait_ready("200")
    # the trainer beat until the container stopped (seconds after alive_at on a loaded machine): its last beat, as
    # the file kept it, is when the run died
    last = ct200.read_json(f"{RUNS}/reboot/heartbeat.json")["updated_at"]
    assert alive_at <= last <= time.time()
    st = tr(play, "reboot", state="status").task("Training run")
    assert st["alive"] is False and st.get("phase") == "dead", st
    assert float(st["dead_since"]) == last, (st, alive_at, last)
    assert st["heartbeat_age_s"] > 0


# --- hostile input -------------------------------------------------------------------------------------------

HOSTILE_NAMES = ["a;touch /tmp/pwned", "$(touch /tmp/pwned)", "../../etc", "x" * 65, "a b", "`touch /tmp/pwned`",
                 ""]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_hostile_run_name_refused(play, ct200, name):
    res = failed(tr(play, name))
    one_line(res["msg"])
    assert ct200.pids("fake_trainer") == []
    assert ct200.sh("ls /tmp/pwned /etc/pid", check=False).returncode != 0
    assert not __import__("os").path.exists("/tmp/pwned")


def test_hostile_values_are_literal(play, ct200):
    evil = "$(touch /tmp/pwned1)`touch /tmp/pwned2`;touch /tmp/pwned3 'x\" \n--help"
    res = launched(tr(play, "literal", env={"EVIL": evil}, trainer_args={"tag": evil}))
    environ = ct200.sh(f"cat /proc/{res['pid']}/environ", check=False).stdout.split("\0")
    assert f"EVIL={evil}" in environ
    argv = ct200.sh(f"cat /proc/{res['pid']}/cmdline").stdout.split("\0")
    assert f"--tag={evil}" in argv, argv
    assert ct200.sh("ls /tmp/pwned1 /tmp/pwned2 /tmp/pwned3", check=False).returncode != 0
    res = failed(tr(play, "literal2", env={"BAD;NAME": "1"}))
    one_line(res["msg"])


def test_secret_env_reaches_the_trainer_only(play, ct200):
    secret = "s3cr3t-value-$(id)"
    r = tr(play, "secret", secret_env={"WANDB_API_KEY": secret})
    res = launched(r)
    assert secret not in r.stdout and secret not in json.dumps(res), "secret leaked into Ansible's output"
    environ = ct200.sh(f"cat /proc/{res['pid']}/environ").stdout.split("\0")
    assert f"WANDB_API_KEY={secret}" in environ
    launch = ct200.read(f"{RUNS}/secret/launch.json")
    assert launch and secret not in launch
    argv_all = ct200.sh("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '", check=False).stdout
    assert secret not in argv_all
