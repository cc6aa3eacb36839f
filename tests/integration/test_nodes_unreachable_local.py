"""A job over two nodes whose node 1 the controller cannot reach, through the project's playbooks (ansible-runner):
node 0 and node 1 are two inventory hosts on this machine (local connection, transport local, a runs root each,
addresses 127.0.0.1 and 127.0.0.2), the real trainer on the CPU (gloo, the tiny target). The job is launched with
both reachable; then node 1's connection is refused (ssh to a port nothing listens on, in the test's inventory:
nothing on this machine's network changes). A restart fails naming node 1 and touches nothing on node 0 (its part
and no reservation left); a stop stops node 0's part and names node 1 as unreachable, and node 1's ranks, their
peers gone, end by themselves: nothing holds either node. The containers' version of the job is
tests/containers/test_nodes_job.py."""
import json
import os
import signal
import sys

import pytest
from ansible_helpers import run_project_playbook

from harness.run_processes import job_processes
from harness.sshd import free_port
from harness.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny):
    root = tmp_path_factory.mktemp("unreachable")
    port, closed = free_port(), free_port()
    run_dirs = {str(root / n / "runs" / "j") for n in ("node0", "node1")}
    count = [0]

    def play(playbook, node1_reachable=True):
        local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "dflash_transport": "local"}
        refused = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": closed,
                   "ansible_ssh_common_args": "-o ConnectTimeout=5 -o StrictHostKeyChecking=no",
                   "ansible_python_interpreter": sys.executable, "dflash_transport": "local"}
        hosts = {"node0": dict(local, dflash_runs_root=str(root / "node0" / "runs"), dflash_node_address="127.0.0.1"),
                 "node1": dict(local if node1_reachable else refused, dflash_runs_root=str(root / "node1" / "runs"),
                               dflash_node_address="127.0.0.2")}
        group = {
            "dflash_trainer_command": [sys.executable, "-m", "dflash_trainer.cli"], "dflash_stop_timeout": 30,
            "dflash_heartbeat_timeout": 60, "dflash_wait_for_phase": "training", "dflash_phase_timeout": 60,
            "dflash_runs": {"j": {
                "nodes": [{"host": "node0", "nproc_per_node": 2}, {"host": "node1", "nproc_per_node": 1}],
                # 0.2 s after each step (the trainer's test hook): the job only has to live and step through the
                # plays
                "rdzv_port": port, "env": {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                                           "DFLASH_DEBUG_STEP_PAUSE_S": "0.2"},
                "trainer_args": {
                    "target_model": str(tiny / "target"), "data_dir": str(tiny / "data"),
                    "output_dir": str(root / "shared"), "target_gpus": [], "drafter_gpus": [], "target_ranks": 1,
                    "block_size": 4, "max_anchors": 16, "num_draft_layers": 1, "gamma": 4, "token_budget": 1024,
                    "max_seq_len": 256, "max_batch_size": 4, "grad_accum": 1, "log_interval": 1,
                    "heartbeat_interval": 0.2, "epochs": 50, "hs_queue_depth": 3, "hs_queue_min_ready": 2}}}}
        inv = root / ("inventory-%d.json" % count[0])
        inv.write_text(json.dumps({"dflash_training": {"hosts": hosts, "vars": group}}))
        count[0] += 1
        return run_project_playbook(root / ("runner-%d" % count[0]), playbook, str(inv), {"run": "j"})

    yield play, run_dirs
    for pid in job_processes(run_dirs):  # processes this module's job started
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def events_of(events, host):
    return [e for e in events if e.get("host") == host]


def test_a_node_the_controller_cannot_reach_is_named_and_holds_nothing(job):
    play, run_dirs = job
    status, events = play("restart_training.yml")
    assert status == "successful", [e["res"].get("msg") for e in events if e["res"].get("failed")]
    launched = job_processes(run_dirs)
    assert len(launched) == 5  # two agents, three ranks

    # a restart with node 1 out of reach: refused naming it, node 0's part and reservation untouched
    status, events = play("restart_training.yml", node1_reachable=False)
    assert status == "failed"
    (failed,) = [e["res"]["msg"] for e in events_of(events, "node0") if e["task"] == "Fail the job, naming the node"]
    assert "node 1 (127.0.0.2): unreachable from the controller at reserve: " in failed, failed
    assert "Connection refused" in failed, failed
    assert job_processes(run_dirs) == launched
    reservation = os.path.join(os.path.dirname(sorted(run_dirs)[0]), ".dflash-job.json")
    assert not os.path.exists(reservation)  # given back

    # a stop: node 0's part stops, node 1 is named unreachable; node 1's rank, its peers gone, ends by itself
    status, events = play("stop_training.yml", node1_reachable=False)
    assert status == "failed"
    stopped = [e["res"] for e in events_of(events, "node0") if e["task"].startswith("Training run")]
    assert stopped and stopped[-1]["changed"], stopped
    wait_for(lambda: not job_processes(run_dirs), 90, "node 1's part to end after node 0's was stopped")
