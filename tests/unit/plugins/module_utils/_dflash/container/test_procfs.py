"""procfs against real processes: children started here, each in a session (process group) of its own, read back
through /proc and stopped with stop_group. Every child is killed (by its own pid/pgid) when its test ends."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import procfs

# A child that announces itself on stdout once its signal handling is in place, then waits.
SLEEPER = textwrap.dedent("""
    import os, signal, sys, time
    mode = sys.argv[1]
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif mode == "slow-exit":
        def on_term(signum, frame):
            time.sleep(0.4)
            os._exit(0)
        signal.signal(signal.SIGTERM, on_term)
    elif mode == "grandchild":
        import subprocess
        kid = subprocess.Popen(["sleep", "60"])  # same process group as this one
        print(kid.pid, flush=True)
    elif mode == "comm":
        with open("/proc/self/comm", "w") as f:
            f.write(sys.argv[2])
    elif mode == "hold":
        held = open(sys.argv[2], "rb")
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.fixture
def spawn():
    """spawn(argv) -> Popen in a new session; the child's group is SIGKILLed and reaped at teardown."""
    procs = []

    def start(argv, ready=True):
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True,
                                close_fds=True)
        procs.append(proc)
        if ready:
            proc.extra = []
            while True:
                line = proc.stdout.readline()
                assert line, "child %r ended before it was ready" % (argv,)
                if line.strip() == b"ready":
                    break
                proc.extra.append(line.decode().strip())
        return proc

    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # pgid == pid: start_new_session
        except ProcessLookupError:
            pass
        proc.wait(10)
        proc.stdout.close()


def sleeper(mode, *args):
    return [sys.executable, "-c", SLEEPER, mode] + list(args)


def wait_state(pid, want, timeout=5.0):
    deadline = time.monotonic() + timeout
    while procfs.proc_state(pid) != want:
        assert time.monotonic() < deadline, "pid %d never reached state %s (is %s)" % (
            pid, want, procfs.proc_state(pid))
        time.sleep(0.01)


TERM_BIT = 1 << (signal.SIGTERM - 1)


def signal_masks(pid):
    """SigPnd, SigBlk, SigIgn, SigCgt of pid as ints, from /proc/<pid>/status."""
    with open("/proc/%d/status" % pid) as f:
        return dict((k, int(v, 16)) for k, _sep, v in (line.partition(":") for line in f)
                    if k in ("SigPnd", "SigBlk", "SigIgn", "SigCgt"))


def no_such_pid():
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1  # above pid_max: can never exist


# --- liveness, process group ------------------------------------------------------------------------------------

def test_live_child_is_alive_and_leads_its_group(spawn):
    proc = spawn(sleeper("plain"))
    assert procfs.is_alive(proc.pid)
    assert procfs.proc_state(proc.pid) in ("R", "S")
    assert procfs.proc_pgrp(proc.pid) == proc.pid
    assert procfs.proc_pgrp(os.getpid()) != proc.pid
    assert procfs.group_members(proc.pid) == [proc.pid]
    assert proc.pid in set(procfs.all_pids()) and os.getpid() in set(procfs.all_pids())


def test_missing_pid_has_no_facts():
    pid = no_such_pid()
    assert procfs.proc_state(pid) is None and procfs.proc_pgrp(pid) is None
    assert not procfs.is_alive(pid)
    assert procfs.cmdline(pid) is None
    assert procfs.group_members(pid) == []


def test_zombie_and_reaped_child_are_not_alive(spawn):
    proc = spawn(sleeper("plain"))
    os.kill(proc.pid, signal.SIGKILL)
    wait_state(proc.pid, "Z")  # not reaped yet: the entry stays in /proc as a zombie
    assert not procfs.is_alive(proc.pid)
    assert procfs.group_members(proc.pid) == []
    assert procfs.cmdline(proc.pid) == []  # a zombie has no memory, hence no command line
    assert not procfs.cmdline_matches(procfs.cmdline(proc.pid), sleeper("plain"))
    assert proc.wait(5) == -signal.SIGKILL
    assert procfs.proc_state(proc.pid) is None and not procfs.is_alive(proc.pid)


def test_group_members_include_children_in_the_group_only(spawn):
    proc = spawn(sleeper("grandchild"))
    grandchild = int(proc.extra[0])
    other = spawn(sleeper("plain"))  # its own session: another group
    assert sorted(procfs.group_members(proc.pid)) == sorted([proc.pid, grandchild])
    assert procfs.proc_pgrp(grandchild) == proc.pid
    assert procfs.group_members(other.pid) == [other.pid]


def test_comm_with_spaces_and_parentheses_does_not_shift_fields(spawn):
    proc = spawn(sleeper("comm", "x) (y z) 9"))
    with open("/proc/%d/comm" % proc.pid) as f:
        assert f.read().strip() == "x) (y z) 9"
    assert procfs.proc_pgrp(proc.pid) == proc.pid
    assert procfs.proc_state(proc.pid) in ("R", "S")
    assert procfs.is_alive(proc.pid)


# --- command lines ----------------------------------------------------------------------------------------------

def test_cmdline_reads_every_argument_verbatim(spawn):
    argv = sleeper("plain", "with space", "", "new\nline", "ünïcödé", "--flag=a,b")
    proc = spawn(argv)
    assert procfs.cmdline(proc.pid) == argv
    assert procfs.cmdline_matches(procfs.cmdline(proc.pid), argv)
    assert not procfs.cmdline_matches(procfs.cmdline(proc.pid), argv[:-1] + ["--flag=a"])


def test_script_started_through_its_shebang_matches_what_was_launched(spawn, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("#!%s\nimport time\nprint('ready', flush=True)\ntime.sleep(60)\n" % sys.executable)
    script.chmod(0o755)
    launched = [str(script), "--lr=1e-4", "two words"]
    proc = spawn(launched)
    actual = procfs.cmdline(proc.pid)
    assert actual == [sys.executable] + launched  # the kernel puts the interpreter in front
    assert procfs.cmdline_matches(actual, launched)
    assert not procfs.cmdline_matches(actual, [str(script), "--lr=1e-3", "two words"])
    assert not procfs.cmdline_matches(actual, [str(tmp_path / "other.py"), "--lr=1e-4", "two words"])


@pytest.mark.parametrize("actual, launched, expected", [
    (["/usr/bin/python3", "/x/train.py", "--a=1"], ["/usr/bin/python3", "/x/train.py", "--a=1"], True),
    (["/usr/bin/python3", "/x/train.py", "--a=1"], ["/x/train.py", "--a=1"], True),       # via shebang
    (["python3", "/x/train.py", "--a=1"], ["train.py", "--a=1"], True),                    # by name
    (["/usr/bin/sleep"], ["sleep"], True),                                                 # no arguments
    (["/usr/bin/python3", "/x/train.py", "--a=2"], ["/x/train.py", "--a=1"], False),       # other value
    (["/usr/bin/python3", "/x/train.py", "--a=1", "--b"], ["/x/train.py", "--a=1"], False),  # extra argument
    (["/usr/bin/python3", "/x/train.py"], ["/x/train.py", "--a=1"], False),                # missing argument
    (["python3", "/x/other.py", "--a=1"], ["/x/train.py", "--a=1"], False),                # pid reused
    (["python3", "x.py"], ["sleep"], False),
    (["b"], ["/x/a", "b"], False),                 # the arguments alone are not the program
    (["--a=1"], ["/x/train.py", "--a=1"], False),
    ([], ["/x/train.py"], False),                  # zombie / kernel thread
    (None, ["/x/train.py"], False),                # gone
    (["/x/train.py"], None, False),                # nothing recorded
    (["/x/train.py"], [], False),
])
def test_cmdline_matches(actual, launched, expected):
    assert procfs.cmdline_matches(actual, launched) is expected


# --- open files -------------------------------------------------------------------------------------------------

def test_holders_of_finds_the_child_holding_a_file(spawn, tmp_path):
    held, free = tmp_path / "nvidia3", tmp_path / "nvidia4"
    held.write_bytes(b"")
    free.write_bytes(b"")
    link = tmp_path / "link-to-nvidia3"
    link.symlink_to(held)
    with open(held, "rb"):  # this process holds it too, and is never listed
        assert procfs.holders_of([str(held)]) == {}
        proc = spawn(sleeper("hold", str(held)))
        real = os.path.realpath(str(held))
        assert procfs.holders_of([str(held)]) == {proc.pid: [real]}
        assert procfs.holders_of([str(link), str(free)]) == {proc.pid: [real]}  # a symlink names the same file
        assert procfs.holders_of([str(free)]) == {}
        assert procfs.holders_of([str(tmp_path / "absent")]) == {}
        os.kill(proc.pid, signal.SIGKILL)
        wait_state(proc.pid, "Z")
        assert procfs.holders_of([str(held)]) == {}


# --- stop_group -------------------------------------------------------------------------------------------------

def test_stop_group_sigterm_honoured(spawn):
    proc = spawn(sleeper("grandchild"))
    grandchild = int(proc.extra[0])
    bystander = spawn(sleeper("plain"))
    res = procfs.stop_group(proc.pid, grace_s=10)
    assert res["pgid"] == proc.pid and res["signal"] == "SIGTERM"
    assert 0 <= res["waited_s"] < 5
    assert proc.wait(5) == -signal.SIGTERM
    assert not procfs.is_alive(grandchild) and procfs.group_members(proc.pid) == []
    assert procfs.is_alive(bystander.pid)  # another group is left alone


def test_stop_group_waits_for_a_slow_exit_within_grace(spawn):
    proc = spawn(sleeper("slow-exit"))
    masks = signal_masks(proc.pid)
    # the child catches SIGTERM and does not block it (a mask inherited from the runner would keep it pending)
    assert masks["SigCgt"] & TERM_BIT and not masks["SigBlk"] & TERM_BIT, masks
    res = procfs.stop_group(proc.pid, grace_s=10)
    assert res["signal"] == "SIGTERM", (res, masks, procfs.proc_state(proc.pid))
    assert 0.35 <= res["waited_s"] < 5
    assert proc.wait(5) == 0  # it exited on its own, after its handler ran


def test_stop_group_sigkills_after_grace_when_sigterm_is_ignored(spawn):
    proc = spawn(sleeper("ignore-term"))
    res = procfs.stop_group(proc.pid, grace_s=0.3)
    assert res["signal"] == "SIGKILL"
    assert 0.3 <= res["waited_s"] < 5
    assert proc.wait(5) == -signal.SIGKILL
    assert not procfs.is_alive(proc.pid)


def test_stop_group_of_a_gone_group_returns_at_once():
    res = procfs.stop_group(no_such_pid(), grace_s=5)
    assert res["signal"] == "SIGTERM" and res["waited_s"] < 1
