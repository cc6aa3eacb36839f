"""job_ranks against real processes standing in for a torchrun job: an "agent" and "ranks", each in a session of
its own (as torchrun starts them), the ranks with the run's DFLASH_RUN_DIR and their RANK in their environment and
their pid in <run dir>/ranks/<rank>.pid, as the trainer's ranks write it. Each stand-in records the signals it got
(with the time) in <run dir>/signals.jsonl. Every process is killed by its pid when its test ends."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import (
    job_ranks, procfs, run_lifecycle, run_status)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import run_config, training_backend

STANDIN = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    role, mode = sys.argv[1], sys.argv[2]
    run_dir = os.environ["DFLASH_RUN_DIR"]
    def note(signum, frame):
        with open(os.path.join(run_dir, "signals.jsonl"), "a") as f:
            f.write(json.dumps({"who": role, "signal": signum, "at": time.time()}) + "\\n")
        if mode != "ignore-term":
            time.sleep(0.3)  # a checkpoint
            os._exit(0)
    signal.signal(signal.SIGTERM, note)
    if mode == "with-child":
        subprocess.Popen(["sleep", "60"])  # a helper of the rank: its process group
    if role.startswith("rank"):
        path = os.path.join(run_dir, "ranks", os.environ["RANK"] + ".pid")
        with open(path + ".tmp", "w") as f:
            f.write("%d\\n" % os.getpid())
        os.replace(path + ".tmp", path)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
""")


@pytest.fixture
def job(tmp_path):
    run_dir = tmp_path / "r1"
    (run_dir / "ranks").mkdir(parents=True)
    started = []

    def start(role, mode="checkpoint", rank=None, env_dir=None):
        env = {"PATH": os.environ["PATH"], "DFLASH_RUN_DIR": str(env_dir or run_dir)}
        if rank is not None:
            env["RANK"] = str(rank)
        proc = subprocess.Popen([sys.executable, "-c", STANDIN, role, mode], env=env, stdout=subprocess.PIPE,
                                start_new_session=True)
        assert proc.stdout.readline() == b"ready\n"
        started.append(proc)
        return proc

    launch = {"job": {"nproc_per_node": 2, "ranks_dir": str(run_dir / "ranks"), "run_dir": str(run_dir),
                      "layout": [{"rank": 0, "role": "target", "gpu": 3, "gpus": [3, 4]},
                                 {"rank": 1, "role": "drafter", "gpu": 5}]}}
    yield run_dir, start, launch
    for proc in started:
        for pid in procfs.group_members(proc.pid):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def signals(run_dir):
    path = run_dir / "signals.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_stop_terms_every_rank_before_the_agent_and_waits_for_all(job, monkeypatch):
    monkeypatch.setattr(job_ranks, "AGENT_GRACE_S", 0.5)  # this agent does not end by itself when its ranks did
    run_dir, start, launch = job
    agent = start("agent")
    ranks = [start("rank0", rank=0), start("rank1", rank=1)]
    assert [(r["rank"], r["alive"], r["role"], r["gpu"], r.get("gpus"))
            for r in job_ranks.rank_states(str(run_dir), launch)] == \
        [(0, True, "target", 3, [3, 4]), (1, True, "drafter", 5, None)]
    info = job_ranks.stop_job(agent.pid, str(run_dir), launch, grace_s=30)
    assert info["signal"] == "SIGTERM" and sorted(info["ranks"]) == sorted(p.pid for p in ranks)
    got = signals(run_dir)
    assert sorted(g["who"] for g in got) == ["agent", "rank0", "rank1"]
    by = dict((g["who"], g["at"]) for g in got)
    assert by["agent"] > max(by["rank0"], by["rank1"])  # the ranks' checkpoints never race the agent's shutdown
    assert all(p.poll() is not None or not procfs.is_alive(p.pid) for p in [agent] + ranks)


def test_stop_kills_ranks_that_ignore_sigterm_with_their_children_and_an_agent_long_gone(job):
    run_dir, start, launch = job
    ranks = [start("rank0", mode="ignore-term", rank=0), start("rank1", mode="with-child", rank=1)]
    child = [pid for pid in procfs.group_members(ranks[1].pid) if pid != ranks[1].pid]
    assert len(child) == 1
    ranks[1].send_signal(signal.SIGKILL)  # rank 1 died: its helper (own group) is left
    ranks[1].wait()
    info = job_ranks.stop_job(None, str(run_dir), launch, grace_s=0.5)  # the agent is gone already
    assert info["signal"] == "SIGKILL" and info["ranks"] == [ranks[0].pid]
    assert not procfs.is_alive(ranks[0].pid)
    # rank 1's pid file names a dead process: it counts as dead, and its helper is not one of the ranks
    assert [(r["rank"], r["alive"]) for r in job_ranks.rank_states(str(run_dir), launch)] == [(0, False), (1, False)]


def test_a_pid_that_is_not_the_runs_rank_is_never_signalled(job, tmp_path):
    run_dir, start, launch = job
    (tmp_path / "other" / "ranks").mkdir(parents=True)
    other_run = start("rank0", rank=0, env_dir=tmp_path / "other")  # rank 0 of another run
    no_rank = start("helper", rank=None)  # the run's environment, but no RANK: a rank's helper
    (run_dir / "ranks" / "0.pid").write_text("%d\n" % other_run.pid)
    (run_dir / "ranks" / "1.pid").write_text("%d\n" % no_rank.pid)
    assert [r["alive"] for r in job_ranks.rank_states(str(run_dir), launch)] == [False, False]
    info = job_ranks.stop_job(None, str(run_dir), launch, grace_s=1)
    assert info["ranks"] == [] and procfs.is_alive(other_run.pid) and procfs.is_alive(no_rank.pid)
    assert signals(run_dir) == [] and signals(tmp_path / "other") == []
    job_ranks.clear_rank_files(str(run_dir / "ranks"))
    assert os.listdir(run_dir / "ranks") == []


def _launched_two_rank_job(job):
    """An agent and ranks 0 and 1 recorded as a launched run r1: (run_dir, agent, ranks, a status request)."""
    run_dir, start, launch = job
    agent = start("agent")
    ranks = [start("rank0", rank=0), start("rank1", rank=1)]
    launch.update(argv=procfs.cmdline(agent.pid), fingerprint="f", launched_at=time.time())
    (run_dir / "launch.json").write_text(json.dumps(launch))
    (run_dir / "pid").write_text("%d\n" % agent.pid)
    return run_dir, agent, ranks, {"run": "r1", "run_dir": str(run_dir), "runs_root": str(run_dir.parent), "gpus": []}


def test_status_of_a_job_that_lost_a_rank_is_not_alive_and_a_restart_replaces_it(job):
    run_dir, agent, ranks, req = _launched_two_rank_job(job)
    healthy = run_status.status(dict(req))
    assert healthy["alive"] is True and healthy["state"] == "running" and healthy["pid"] == agent.pid
    ranks[1].send_signal(signal.SIGKILL)
    ranks[1].wait()
    failing = run_status.status(dict(req))
    assert failing["alive"] is False and failing["pid"] == agent.pid
    assert failing["state"].startswith("failing (rank 1 (pid %d) gone while the torchrun agent, pid %d, lives"
                                       % (ranks[1].pid, agent.pid)), failing["state"]
    found, _pid, _launch = run_status.conflicting_runs(req)
    assert found == [("r1", agent.pid)]  # still to be stopped before a relaunch
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    orphan = run_status.status(dict(req))
    assert orphan["state"] == ("not running (the torchrun agent is gone but rank 0 (pid %d) is left: stop the run "
                               "to end it)" % ranks[0].pid)
    assert run_status.conflicting_runs(req)[0] == [("r1", None)]
    # state=stopped ends what is left, and records the stop against the agent's pid
    params = dict(training_backend.argument_spec().defaults(), name="r1", state="stopped", transport="local",
                  runs_root=str(run_dir.parent), lock_timeout=5, stop_timeout=5)
    res = run_lifecycle.change(run_config.build_request(params))
    assert res["action"] == "stopped" and res["pid"] is None, res
    (stop,) = res["stopped"]
    assert (stop["pid"], stop["signal"], stop["ranks"]) == (agent.pid, "SIGTERM", [ranks[0].pid])
    assert not procfs.is_alive(ranks[0].pid) and [g["who"] for g in signals(run_dir)] == ["rank0"]
    assert json.loads((run_dir / "stopped.json").read_text())["pid"] == agent.pid


def test_pid_files_left_by_a_sigkilled_job_are_retired_by_the_next_status_and_nothing_fails(job):
    # a SIGKILLed rank cannot remove its pid file (every other exit does): the files name processes that are gone;
    # the next status retires them (rank_ends.retire_stale), and names no rank: they all went with their agent
    run_dir, agent, ranks, req = _launched_two_rank_job(job)
    for proc in [agent] + ranks:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert sorted(os.listdir(run_dir / "ranks")) == ["0.pid", "1.pid"]
    res = run_status.status(dict(req))
    assert res["alive"] is False and res["pid"] is None
    assert res["ranks"] == [] and sorted(os.listdir(run_dir / "ranks")) == ["0.end.json", "1.end.json"]
    assert res["failed_rank"] is None
    assert res["state"].startswith("crashed"), res["state"]  # not "failing" nor "rank ... is left"
    assert run_status.conflicting_runs(req)[0] == []  # nothing to stop before a relaunch
    info = job_ranks.stop_job(None, str(run_dir), job[2], grace_s=1)
    assert info["ranks"] == [] and info["signal"] == "SIGTERM" and signals(run_dir) == []


def test_a_stale_rank_file_is_retired_by_the_next_status_and_the_killed_rank_named_first(job):
    """The agent SIGKILLed took its ranks with it (here: each killed by its pid): their pid files stay behind. The
    next status lists no gone rank any more, and names the rank killed from outside, with its signal as the
    agent logged it, before the error a peer wrote on its way out (rank_ends.py)."""
    run_dir, start, launch = job
    agent = start("agent")
    ranks = [start("rank0", rank=0), start("rank1", rank=1)]
    (run_dir / "launch.json").write_text(json.dumps(dict(launch, argv=["x"])))
    (run_dir / "pid").write_text("%d\n" % agent.pid)
    ranks[1].kill()
    ranks[1].wait()
    (run_dir / "ranks" / "0.end.json").write_text(json.dumps({  # the peer's knock-on error, as dist_train writes it
        "rank": 0, "role": "target", "pid": ranks[0].pid, "rc": 1, "at": time.time(),
        "error": "RuntimeError: sending hidden states failed: Connection reset by peer GLHF! 🏖️"}))
    (run_dir / "ranks" / "0.pid").unlink()
    ranks[0].kill()
    agent.kill()
    for p in (ranks[0], agent):
        p.wait()
    (run_dir / "train.log").write_text(
        "E1203 torch/distributed/elastic/multiprocessing/api.py:1003] failed (exitcode: -9) local_rank: 1 (pid: %d) "
        "of binary: dflash-train\n" % ranks[1].pid)
    out = run_status.status({"run": "r1", "run_dir": str(run_dir)})
    assert out["ranks"] == [] and not (run_dir / "ranks" / "1.pid").exists()  # retired, not listed as gone
    assert out["failed_rank"] == {"rank": 1, "role": "drafter", "pid": ranks[1].pid, "rc": -9,
                                  "exit": "killed by SIGKILL"}
    assert out["state"].startswith("crashed (rank 1 drafter (pid %d) killed by SIGKILL; then " % ranks[1].pid), \
        out["state"]
    again = run_status.status({"run": "r1", "run_dir": str(run_dir)})  # the cause stays known once retired
    assert again["failed_rank"] == out["failed_rank"] and again["state"] == out["state"]


def test_a_rank_pid_file_of_a_reused_pid_is_retired(job):
    run_dir, start, launch = job
    (run_dir / "launch.json").write_text(json.dumps(dict(launch, argv=["x"])))
    other = start("agent")  # a live process that is no rank of this run: the pid was reused
    (run_dir / "ranks" / "0.pid").write_text("%d\n" % other.pid)
    out = run_status.status({"run": "r1", "run_dir": str(run_dir)})
    assert out["ranks"] == [] and not (run_dir / "ranks" / "0.pid").exists()
    assert other.poll() is None  # never signalled
