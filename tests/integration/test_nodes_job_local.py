"""A torchrun job over two "nodes" on this host, driven through run_lifecycle's job steps as the training role drives
them (reserve, stop, launch, verify on every node before the next step): two runs roots stand
for the two containers, 127.0.0.1 and 127.0.0.2 (this host's loopback) for their addresses, gloo on the CPU, the
trainer's tiny target. The containers' version (ssh -tt, pct, two LXC containers, the playbooks) is
tests/containers/test_nodes_job.py; this one checks the module's side in seconds."""
import json
import os
import signal
import sys

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import run_lifecycle, run_status
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import run_config, training_backend
from harness.run_processes import job_processes
from harness.sshd import free_port
from harness.waiting import wait_for

pytestmark = pytest.mark.slow
NODES = [{"address": "127.0.0.1", "nproc_per_node": 2}, {"address": "127.0.0.2", "nproc_per_node": 1}]
STEPS = ("reserve", "stop", "launch", "verify")


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny):
    root = tmp_path_factory.mktemp("nodes")
    port = free_port()

    def req(node, token="t1", step=None, state="restarted", **params):
        p = training_backend.argument_spec().defaults()
        runs_root = root / ("node%d" % node) / "runs"
        p.update(name="j", state=state, transport="local", runs_root=str(runs_root), nodes=NODES, node=node,
                 rdzv_port=port, job_step=step, job_token=token,
                 command=[sys.executable, "-m", "dflash_trainer.cli"],
                 # 0.2 s after each step (the trainer's test hook): the job only has to live and step beside the
                 # module calls
                 env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "DFLASH_DEBUG_STEP_PAUSE_S": "0.2"},
                 trainer_args={"target_model": str(tiny / "target"), "data_dir": str(tiny / "data"),
                               "output_dir": str(root / "shared"), "run_dir": str(runs_root / "j"),
                               "target_gpus": [], "drafter_gpus": [], "target_ranks": 1, "block_size": 4,
                               "max_anchors": 16, "num_draft_layers": 1, "gamma": 4, "token_budget": 1024,
                               "max_seq_len": 256, "max_batch_size": 4, "grad_accum": 1, "log_interval": 1,
                               "heartbeat_interval": 0.2, "epochs": 50, "hs_queue_depth": 3,
                               "hs_queue_min_ready": 2},
                 settle_time=0.2, heartbeat_timeout=60, stop_timeout=30, lock_timeout=30, log_tail_lines=30,
                 wait_for_phase="training", phase_timeout=60)
        p.update(params)
        return run_config.build_request(p)

    run_dirs = {str(root / ("node%d" % n) / "runs" / "j") for n in (0, 1)}
    yield req, run_dirs
    for pid in job_processes(run_dirs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def restart(req, token, **params):
    """Every step on both nodes before the next, as roles/training/tasks/run_nodes.yml runs them."""
    answers = {}
    for step in STEPS:
        for node in (0, 1):
            answers[(step, node)] = run_lifecycle.job_step(req(node, token, step, **params))
    return answers


def test_a_job_over_two_nodes_launches_with_rank_0_on_node_0_and_a_second_reserve_finds_it_alive(job):
    req, run_dirs = job
    a = restart(req, "tok1")
    v0, v1 = a[("verify", 0)], a[("verify", 1)]
    assert [(r["rank"], r["role"], r["node"], r["alive"]) for r in v0["ranks"]] == [
        (0, "target", 0, True), (1, "drafter", 0, True)], v0
    assert [(r["rank"], r["role"], r["node"], r["alive"]) for r in v1["ranks"]] == [(2, "drafter", 1, True)], v1
    assert v0["heartbeat"]["phase"] == "training" and v1["heartbeat"] is None
    launch = [json.load(open(os.path.join(d, "launch.json"))) for d in sorted(run_dirs)]
    assert launch[0]["fingerprint"] == launch[1]["fingerprint"]  # one job: the same on every node
    assert launch[0]["job"]["nodes"] == NODES and [x["job"]["node"] for x in launch] == [0, 1]
    rdzv = [a for a in launch[1]["argv"] if a.startswith("--rdzv-id=")]
    assert rdzv == ["--rdzv-id=j-%s-tok1" % launch[0]["fingerprint"]]
    assert all(a[("verify", n)]["released"] for n in (0, 1))  # a node proven live gives its reservation back
    # another restart with the same configuration: every node answers alive and the same (the role's no-op)
    for node in (0, 1):
        r = run_lifecycle.job_step(req(node, "tok2", "reserve"))
        assert r["alive"] and r["same_config"], r
        # while it holds the node, any other lifecycle operation there is refused
        with pytest.raises(run_lifecycle.LifecycleError, match="reserved by the restart of job j"):
            run_lifecycle.change(req(node, "tok3", None, state="stopped"))
        assert run_lifecycle.job_step(req(node, "tok2", "release"))["released"]
    # node 0's status names the slowest rank's node (rank 0 relays every rank's step into its heartbeat)
    status = wait_for(lambda: (lambda s: s if s.get("slowest_node") else None)(
        run_status.status(req(0, state="status", step=None))), 30, "the slowest node in node 0's status")
    assert status["alive"] and status["node"] == "node 0 (127.0.0.1)", status
    assert status["slowest_node"]["node"] in (0, 1) and status["slowest_node"]["rank"] in (0, 1, 2), status


def test_a_rank_killed_on_node_1_ends_the_job_on_both_nodes(job):
    req, run_dirs = job
    if not job_processes(run_dirs):
        restart(req, "tok4")
    (rank2,) = [r for r in run_status.status(req(1, state="status", step=None))["ranks"] if r["rank"] == 2]
    os.kill(rank2["pid"], signal.SIGKILL)
    wait_for(lambda: not job_processes(run_dirs), 60, "a process of the job outlived rank 2's SIGKILL on node 1")
    for node in (0, 1):
        assert run_status.status(req(node, state="status", step=None))["alive"] is False


def test_a_second_restart_waits_for_the_first_to_give_the_node_back(job):
    """Two restarts of one job: the second's reserve waits (outside the lifecycle lock, which the first's steps
    take) until the first releases the node, then reserves it and names whom it waited for."""
    import threading
    req, _run_dirs = job
    assert run_lifecycle.job_step(req(0, "first", "reserve"))["node"] == "node 0 (127.0.0.1)"
    answer = {}
    second = threading.Thread(target=lambda: answer.update(run_lifecycle.job_step(req(0, "second", "reserve"))))
    second.start()
    second.join(timeout=2)
    assert second.is_alive()  # still waiting: the node is the first restart's
    assert run_lifecycle.job_step(req(0, "first", "release"))["released"]  # the lifecycle lock was free meanwhile
    second.join(timeout=60)
    assert not second.is_alive() and answer["waited_for"]["token"] == "first", answer
    assert answer["waited_for"]["run"] == "j" and answer["waited_for"]["waited_s"] >= 2
    assert run_lifecycle.job_step(req(0, "second", "release"))["released"]
