"""run_lifecycle (local mode, called directly) with a real torchrun job: `python -m torch.distributed.run
--standalone` of dflash-train (gloo, the CPU, the trainer's tiny target and data), 1 target rank + 2 drafter ranks,
requested through run_config with training_run's own defaults and nproc_per_node=3. Every process a test starts
carries the run directory in its environment (DFLASH_RUN_DIR, set by the lifecycle and inherited by every rank):
that is how a test finds "the job's processes" in /proc, and what its teardown kills (by pid). Here, not in
tests/unit: it needs the trainer and torch (the checkout's .venv), which ansible-test's unit environment lacks."""
import json
import os
import signal
import sys

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import procfs, run_lifecycle, run_status
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import run_config, training_backend
from dflash_trainer.telemetry.writers import read_jsonl
from harness import run_processes
from harness.waiting import wait_for

pytestmark = pytest.mark.slow
NPROC = 3


def job_processes(run_dir):
    """Every live process of this run's launches: the agent, its ranks and anything they started."""
    return run_processes.job_processes({run_dir})


def kill_job(root):
    for pid in job_processes(str(root / "r1")):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def runs_root(tmp_path):
    root = tmp_path / "runs"
    yield root
    kill_job(root)


@pytest.fixture(scope="module")
def live_job(tmp_path_factory, tiny):
    """One job every refused configuration is tried against: each refusal must leave it as it was (so the next one
    finds it live too, and each test checks that again)."""
    root = tmp_path_factory.mktemp("live") / "runs"
    first = run_lifecycle.change(make_req(root, tiny))
    yield root, first
    kill_job(root)


def make_req(runs_root, tiny, extra_args=None, **params):
    p = training_backend.argument_spec().defaults()
    run_dir = str(runs_root / "r1")
    p.update(name="r1", state="restarted", transport="local", runs_root=str(runs_root),
             command=[sys.executable, "-m", "dflash_trainer.cli"], nproc_per_node=NPROC,
             # 0.2 s after each step (the trainer's test hook): the job only has to live and step beside the test
             env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "DFLASH_DEBUG_STEP_PAUSE_S": "0.2"},
             trainer_args={"target_model": str(tiny / "target"), "data_dir": str(tiny / "data"),
                           "output_dir": str(runs_root / "out"), "run_dir": run_dir, "target_gpus": [],
                           "drafter_gpus": [], "target_ranks": 1, "block_size": 4, "max_anchors": 16,
                           "num_draft_layers": 1, "gamma": 4, "token_budget": 1024, "max_seq_len": 256,
                           "max_batch_size": 4, "grad_accum": 1, "log_interval": 1, "heartbeat_interval": 0.2,
                           "epochs": 50, "hs_queue_depth": 3, "hs_queue_min_ready": 2, **(extra_args or {})},
             settle_time=0.2, heartbeat_timeout=120, stop_timeout=60, lock_timeout=5, log_tail_lines=30,
             wait_for_phase="training", phase_timeout=120)
    p.update(params)
    return run_config.build_request(p)


def test_restart_of_a_three_process_job_leaves_one_jobs_processes_and_stop_ends_them_all(runs_root, tiny):
    run_dir = str(runs_root / "r1")
    first = run_lifecycle.change(make_req(runs_root, tiny))
    assert first["action"] == "launched", first
    agent = first["pid"]
    # the agent is the process launched: torchrun, running the trainer's module under its own interpreter
    argv = procfs.cmdline(agent)
    assert argv[:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1",
                        "--nproc-per-node=3"], argv
    assert "--shutdown-timeout=60" in argv and argv[argv.index("-m", 2):][:2] == ["-m", "dflash_trainer.cli"]
    ranks = first["ranks"]
    assert [(r["rank"], r["role"], r["alive"]) for r in ranks] == [(0, "target", True), (1, "drafter", True),
                                                                   (2, "drafter", True)], ranks
    # torchrun put each rank in a session of its own: a signal to the agent's group alone would miss them
    assert all(procfs.proc_pgrp(r["pid"]) == r["pid"] != procfs.proc_pgrp(agent) for r in ranks)
    assert job_processes(run_dir) == {agent} | {r["pid"] for r in ranks}
    launch = json.loads((runs_root / "r1" / "launch.json").read_text())
    assert launch["job"]["nproc_per_node"] == 3 and launch["job"]["ranks_dir"] == run_dir + "/ranks"
    assert [e["role"] for e in launch["job"]["layout"]] == ["target", "drafter", "drafter"]
    assert launch["checkpoints"] == str(runs_root / "out" / "checkpoints")

    status = run_status.status(make_req(runs_root, tiny, state="status"))
    assert status["alive"] is True and status["state"] == "running" and status["pid"] == agent
    assert [r["pid"] for r in status["ranks"]] == [r["pid"] for r in ranks]
    wait_for(lambda: len(read_jsonl(os.path.join(run_dir, "metrics.jsonl"))) >= 2, 120,
             "no optimizer step within 120 s")
    assert run_lifecycle.change(make_req(runs_root, tiny))["action"] == "noop"

    # forced restart: every rank gets SIGTERM, the drafters checkpoint, the job ends by itself, then the new one
    second = run_lifecycle.change(make_req(runs_root, tiny, force=True))
    assert second["action"] == "launched", second
    (stop,) = second["stopped"]
    assert stop["signal"] == "SIGTERM" and stop["pid"] == agent, stop
    assert sorted(stop["ranks"]) == sorted(r["pid"] for r in ranks)
    old = {agent} | {r["pid"] for r in ranks}
    assert not any(procfs.is_alive(pid) for pid in old)
    new = {second["pid"]} | {r["pid"] for r in second["ranks"]}
    assert len(new) == 1 + NPROC and not new & old
    assert job_processes(run_dir) == new  # exactly one job's processes: no orphan rank of the first
    kept_log = next(open(k).read() for k in second["kept"] if k.endswith(".log"))
    # no rank was killed: torchrun reports a failed (signalled) rank with its exit code
    assert "exitcode" not in kept_log and "SIGKILL" not in kept_log, kept_log[-3000:]
    # "[rank 1 drafter 0] checkpoint <dir>/step-N (s)": the first drafter rank writes it, every drafter waits for it
    saved = [line.split("] checkpoint ", 1)[1].split()[0] for line in kept_log.splitlines() if "] checkpoint " in line]
    assert saved, kept_log[-3000:]
    ckpt = saved[-1]
    wait_for(lambda: "resumed from %s" % ckpt in open(os.path.join(run_dir, "train.log")).read(), 60,
             "the new job did not resume from the SIGTERM checkpoint %s" % ckpt)

    # stop: every process of the job goes, and the state says it checkpointed
    wait_for(lambda: len(read_jsonl(os.path.join(run_dir, "metrics.jsonl"))) >= 1, 120,
             "no step of the second job")
    stopped = run_lifecycle.change(make_req(runs_root, tiny, state="stopped"))
    assert stopped["action"] == "stopped" and stopped["stopped"][0]["signal"] == "SIGTERM", stopped
    assert job_processes(run_dir) == set()
    status = run_status.status(make_req(runs_root, tiny, state="status"))
    assert status["alive"] is False and status["state"].startswith("not running (stopped by SIGTERM at step "), status
    assert status["state"].endswith(", checkpointed)") and not any(r["alive"] for r in status["ranks"])


def test_a_sigkilled_agent_leaves_no_rank_and_stop_ends_what_is_left(runs_root, tiny):
    run_dir = str(runs_root / "r1")
    res = run_lifecycle.change(make_req(runs_root, tiny, wait_for_phase=None))
    assert res["action"] == "launched", res
    rank_pids = [r["pid"] for r in res["ranks"]]
    assert len(rank_pids) == NPROC and all(procfs.is_alive(p) for p in rank_pids)
    os.kill(res["pid"], signal.SIGKILL)
    # the ranks die with their agent (the trainer's parent-death signal), although in sessions of their own
    wait_for(lambda: not any(procfs.is_alive(p) for p in rank_pids), 10, "a rank outlived its SIGKILLed agent")
    status = run_status.status(make_req(runs_root, tiny, state="status"))
    assert status["alive"] is False and status["pid"] is None and not any(r["alive"] for r in status["ranks"])
    stopped = run_lifecycle.change(make_req(runs_root, tiny, state="stopped"))
    assert stopped["action"] == "none" and job_processes(run_dir) == set(), stopped


def _step(run_dir):
    return (json.load(open(os.path.join(run_dir, "heartbeat.json"))).get("step") or 0)


@pytest.mark.parametrize("extra,line", [
    # a layout torchrun's ranks would refuse: 3 target ranks of 3 leave no drafter
    ({"target_ranks": 3},
     "--target-ranks 3 leaves 0 drafter ranks of the 3 torchrun started; pass --target-ranks between 1 and 2"),
    # a misspelled flag in trainer_args, the everyday typo
    ({"blok_size": 8},
     "unrecognized argument --blok-size=8: dflash-train has no flag --blok-size; did you mean --block-size?"),
])
def test_a_configuration_the_trainer_refuses_leaves_the_live_job_as_it_was(live_job, tiny, extra, line):
    runs_root, first = live_job
    run_dir = str(runs_root / "r1")
    agent, ranks = first["pid"], {r["pid"] for r in first["ranks"]}
    wait_for(lambda: _step(run_dir) >= 1, 120, "no step of the live job")
    launch_before = open(os.path.join(run_dir, "launch.json")).read()
    logs_before = sorted(n for n in os.listdir(run_dir) if n.endswith(".log"))
    for check_mode in (True, False):
        req = make_req(runs_root, tiny, extra)
        req["check_mode"] = check_mode
        with pytest.raises(run_lifecycle.LifecycleError) as exc:
            run_lifecycle.change(req)
        assert str(exc.value) == ("the trainer's check refused this configuration, so nothing was stopped (r1 "
                                  "(pid %d) still running): %s" % (agent, line))
    step = _step(run_dir)
    wait_for(lambda: _step(run_dir) > step, 120, "the live job stopped stepping")
    assert job_processes(run_dir) == {agent} | ranks
    assert open(os.path.join(run_dir, "launch.json")).read() == launch_before
    assert sorted(n for n in os.listdir(run_dir) if n.endswith(".log")) == logs_before


def test_a_killed_drafter_rank_is_named_first_with_its_role_and_signal(runs_root, tiny):
    """kill -9 of drafter rank 2 mid-training: the peers fail on the broken connection (gloo's text, emoji and
    all), torchrun ends the job; status names rank 2, its role and its signal before anything it caused, in plain
    ASCII, and the rank's pid file left behind is retired (no rank listed as gone)."""
    run_dir = str(runs_root / "r1")
    res = run_lifecycle.change(make_req(runs_root, tiny))
    assert res["action"] == "launched", res
    victim = res["ranks"][2]
    wait_for(lambda: len(read_jsonl(os.path.join(run_dir, "metrics.jsonl"))) >= 1, 120, "no optimizer step")
    os.kill(victim["pid"], signal.SIGKILL)
    wait_for(lambda: not procfs.is_alive(res["pid"]), 90, "torchrun did not end the job")
    status = run_status.status(make_req(runs_root, tiny, state="status"))
    prefix = "crashed (rank 2 drafter (pid %d) killed by SIGKILL; then " % victim["pid"]
    assert status["state"].startswith(prefix), status["state"]
    assert status["state"].isascii() and status["ranks"] == []
    assert status["failed_rank"] == {"rank": 2, "role": "drafter", "pid": victim["pid"], "rc": -9,
                                     "exit": "killed by SIGKILL"}
    hb = status["heartbeat"]  # rank 0's, when it failed on the broken connection: the killed peer before its error
    assert hb["phase"] != "failed" or hb["failed_rank"] == {
        "rank": 2, "role": "drafter", "pid": victim["pid"], "exit": "gone without an error of its own (killed?)"}, hb
