"""A connection dropped mid-play (issue 20): where the module's copy with the secrets may stay on the Proxmox host.

Through the real chain (ansible-playbook -> the harness sshd -> pct -> LXC); the drop kills the sshd's session
processes while training_run runs. Without pipelining (ssh -tt) Ansible copies the module, arguments and
secret_env included, into <remote_tmp>/ansible-tmp-*/ and the cut-off play cannot remove it: the next
training_run names it in a warning and removes it. With pipelining the module travels on stdin and no copy
ever exists. Each test uses a remote_tmp of its own (ANSIBLE_REMOTE_TMP) so that concurrent plays do not mix.
"""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.fixtures import FAKE_TRAINER_CT, run_playbook
from harness.waiting import wait_for

pytestmark = pytest.mark.containers
REPO = Path(__file__).resolve().parents[2]
PLAY = REPO / "tests/containers/playbooks/training_run.yml"
INVENTORY = REPO / "inventories/harness/hosts.yml"
SECRET = "dropped-s3cr3t-7f1c"
MIN_AGE_S = 15  # remote_tmp_leftovers.MIN_AGE_S: a younger copy may be a concurrent play's about to start


def module_copies(remote_tmp):
    return sorted(p.parent for p in Path(remote_tmp).glob("ansible-tmp-*/AnsiballZ_training_run.py"))


def holders(remote_tmp):
    """Pids of the processes running a module from remote_tmp (their command line names it)."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and remote_tmp.encode() in (d / "cmdline").read_bytes():
                found.append(int(d.name))
        except OSError:
            pass
    return found


def module_play(name):
    """training_run alone, restarting `name` with a secret; it waits 5 s after the launch (settle_time)."""
    args = {"name": name, "command": ["python3", FAKE_TRAINER_CT], "settle_time": 5, "heartbeat_timeout": 20,
            "stop_timeout": 10, "gpu_release_timeout": 5, "secret_env": {"API_KEY": SECRET}}
    return [str(PLAY), "-e", json.dumps({"tr": args})]


def trainer_pids(ct):
    """The fake trainer's pids in the container, less a `--check` of it (training_run asks the trainer to check the
    configuration before anything is stopped: that short-lived process is not the launch)."""
    script = ("for p in $(pgrep -f [f]ake_trainer); do tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null | "
              "grep -q -- ' --check' || echo $p; done")
    return [int(x) for x in ct.sh(script, check=False).stdout.split()]


def drop_mid_play(env, sshd, ct, play_args, pipelining, seen):
    """Runs ansible-playbook, drops the ssh link once the trainer is launched; returns (rc, output).
    `seen` collects every module copy found under remote_tmp while the play runs."""
    cmd = ["ansible-playbook", "-i", str(INVENTORY), *play_args, "-e", json.dumps({"ansible_ssh_pipelining": pipelining})]
    p = subprocess.Popen(cmd, env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def launched():
            seen.update(module_copies(env["ANSIBLE_REMOTE_TMP"]))
            return trainer_pids(ct)
        wait_for(launched, 60, "the launch")
        # The link is lost: the host's sshd stops (no reconnection, so Ansible cannot clean up), and the session's
        # processes end with it, the module's own included (killed first: alone, the remote shell would go on to
        # remove the copy itself, which a real hangup does not let it do).
        kids = sshd.children()
        assert kids, "no ssh session to drop"
        os.kill(sshd.pid, signal.SIGKILL)
        sshd.proc.wait()
        # Stopped first, then killed: killed one by one, a remote shell could see its module die and run the rm
        # that follows it in the same command before its own turn came (a flaky 'no module copy left').
        session = holders(env["ANSIBLE_REMOTE_TMP"]) + kids  # ours, by pid
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in session:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        sshd.start()  # the same port and keys: the host is back
    return p.returncode, out


@pytest.fixture
def env(harness_env, tmp_path):  # `play` in a test puts ansible-playbook on PATH for run_playbook
    remote_tmp = tmp_path / "remote_tmp"
    remote_tmp.mkdir()
    return dict(harness_env, ANSIBLE_REMOTE_TMP=str(remote_tmp))


def test_without_pipelining_the_next_run_removes_the_interrupted_copy(env, play, sshd, ct200):
    seen = set()
    rc, out = drop_mid_play(env, sshd, ct200, module_play("dropped-tt"), False, seen)
    assert rc != 0, out[-2000:]
    left = module_copies(env["ANSIBLE_REMOTE_TMP"])
    assert left, f"no module copy left by the cut-off play (seen while it ran: {seen})\n{out[-2000:]}"
    youngest = max(p.stat().st_mtime for p in left)
    time.sleep(max(0.0, youngest + MIN_AGE_S + 1 - time.time()))

    r = run_playbook(env, PLAY, {"tr": {"name": "dropped-tt", "state": "status"}})
    st = r.task("Training run")
    assert st["alive"] is True, st  # the restart completed in the container although the play was cut off
    warnings = " ".join(st.get("warnings", []))
    for path in left:
        assert str(path) in warnings, warnings
        assert not path.exists()
    assert "interrupted play" in warnings and "secret_env" in warnings
    assert module_copies(env["ANSIBLE_REMOTE_TMP"]) == []
    # A completed play leaves no copy either.
    assert not any(SECRET in p.read_text(errors="replace") for p in Path(env["ANSIBLE_REMOTE_TMP"]).rglob("*")
                   if p.is_file())


def test_with_pipelining_no_copy_ever_touches_the_host(env, play, sshd, ct200):
    seen = set()
    rc, out = drop_mid_play(env, sshd, ct200, module_play("dropped-pipe"), True, seen)
    assert rc != 0, out[-2000:]
    assert seen == set() and module_copies(env["ANSIBLE_REMOTE_TMP"]) == []
    assert [p for p in Path(env["ANSIBLE_REMOTE_TMP"]).rglob("*") if p.is_file()] == []
    r = run_playbook(env, PLAY, {"tr": {"name": "dropped-pipe", "state": "status"}}, cmdline="-e ansible_ssh_pipelining=true")
    st = r.task("Training run")
    assert st["alive"] is True and not st.get("warnings"), st


# The product's playbook: a trainer that takes 4 s to load (the module waits for its heartbeat), the link lost then.
SLOW_START = ["python3", "-c", "import runpy, sys, time; time.sleep(4); "
              f"sys.argv = [{FAKE_TRAINER_CT!r}] + sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"]
FAKE_RUNS = {"dflash_trainer_command": SLOW_START, "dflash_run_defaults": {"trainer_args": {}, "env": {}},
             "dflash_wait_for_phase": "training"}


@pytest.mark.parametrize("pipelining", [False, True], ids=["ssh-tt", "pipelining"])
def test_restart_cut_off_says_what_may_have_happened_and_what_to_run(env, play, sshd, ct200, pipelining):
    restart = [str(REPO / "playbooks/restart_training.yml"), "--limit", "ct200", "-e", "run=tiny",
               "-e", json.dumps(FAKE_RUNS)]
    rc, out = drop_mid_play(env, sshd, ct200, restart, pipelining, set())
    assert rc != 0, out[-3000:]
    text = " ".join(out.split())
    assert "the connection to ct200 was lost while training_run restarted ran for run tiny" in text, out[-3000:]
    assert "may have completed in the container" in text
    assert "ansible-playbook playbooks/training_status.yml -e run=tiny" in text
    assert "ansible-playbook playbooks/restart_training.yml -e run=tiny` again without force" in text
    pid = wait_for(lambda: trainer_pids(ct200), 30, "the run")
    # What the message says to run: the restart again without force keeps the live run (a no-op).
    r = run_playbook(env, REPO / "playbooks/restart_training.yml", {"run": "tiny", **FAKE_RUNS}, limit="ct200")
    assert r.rc == 0, r.stdout[-3000:]
    assert trainer_pids(ct200) == pid
