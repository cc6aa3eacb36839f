"""A torchrun job over two nodes on this machine, on the CPU (gloo): two torchrun agents (--nnodes 2, c10d
rendezvous on 127.0.0.1; node 0 at 127.0.0.1, node 1 at 127.0.0.2), each running the same GPU lists rehearsed on
the CPU (--device cpu --target-gpus 0 --drafter-gpus 1): every node 1 target + 1 drafter rank, so the roles
alternate by node (ranks 0, 2 target; 1, 3 drafter) - the layout a 2-host GPU job gets (world.py). Then node 1
frozen mid-run (SIGSTOP to its agent and ranks: a host that hangs or drops off the network answers nothing, resets
nothing): node 0's ranks give up after --collective-timeout and its agent ends, instead of holding its GPUs for
torch's default 30 minutes."""

import json
import os
import signal
import socket
import sys
import time

import pytest

from trainer_testlib import alive, read_heartbeat, read_metrics, start, train_cmd, wait_for

STEPS = 6


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent(tiny, out, node, port, *extra):
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"nodes-{port}",
            "--rdzv-conf", f"join_timeout=120,is_host={int(node == 0)}", "--max-restarts", "0",
            "--local-addr", f"127.0.0.{node + 1}", "-m", "dflash_trainer.cli",
            *train_cmd(tiny, out, "--device", "cpu", "--target-gpus", "0", "--drafter-gpus", "1", *extra)[3:]]


@pytest.mark.slow
def test_two_node_job_gives_each_rank_its_role_and_trains_as_one_process(tiny, tmp_path):
    ref, out, port = tmp_path / "ref", tmp_path / "out", _free_port()
    reference = start(train_cmd(tiny, ref, "--grad-accum", "2", "--max-steps", str(STEPS)), tmp_path / "ref.log")
    # G = --grad-accum 1 x 2 drafter ranks = the reference's 2 micro-batches per step
    agents = [start(_agent(tiny, out, node, port, "--max-steps", str(STEPS), "--hs-queue-depth", "3",
                           "--hs-queue-min-ready", "1"), tmp_path / f"node{node}.log") for node in (0, 1)]
    for node, agent in enumerate(agents):
        assert agent.wait(timeout=300) == 0, (tmp_path / f"node{node}.log").read_text()[-3000:]
    assert reference.wait(timeout=300) == 0, (tmp_path / "ref.log").read_text()[-3000:]
    hb = read_heartbeat(out)
    assert hb["phase"] == "finished" and hb["step"] == STEPS
    assert [(r["rank"], r["role"], r["role_rank"], r["node"], r["local_rank"], r["device"], r["rehearses"])
            for r in hb["world"]] == [(0, "target", 0, 0, 0, "cpu", ["cuda:0"]), (1, "drafter", 0, 0, 1, "cpu", ["cuda:1"]),
                                      (2, "target", 1, 1, 0, "cpu", ["cuda:0"]), (3, "drafter", 1, 1, 1, "cpu", ["cuda:1"])]
    # each node's log holds its own ranks, tagged with their roles
    node1 = (tmp_path / "node1.log").read_text()
    assert "[rank 2 target 1]" in node1 and "[rank 3 drafter 1]" in node1 and "[rank 0 " not in node1
    assert "world: 2 target + 2 drafter ranks (gloo transport)" in (tmp_path / "node0.log").read_text()
    # both targets fed both drafters: the same batches and losses as one process
    ref_rows = {r["step"]: (r["loss"], r["data_crc"]) for r in read_metrics(ref)}
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["data_crc"] == ref_rows[r["step"]][1], f"step {r['step']}: other batches than one process"
        assert abs(r["loss"] - ref_rows[r["step"]][0]) <= 1e-4 * max(1.0, abs(r["loss"])), (r, ref_rows[r["step"]])
    assert json.loads(json.dumps(hb["ranks"]))["3"]["step"] == STEPS


def _pids(path):
    with open(path) as f:
        return int(f.read().strip())


@pytest.mark.slow
def test_a_frozen_node_ends_the_other_nodes_part_after_the_collective_timeout(tiny, tmp_path):
    out, port = tmp_path / "out", _free_port()
    agents = [start(_agent(tiny, out, node, port, "--epochs", "50", "--hs-queue-depth", "3", "--hs-queue-min-ready",
                           "1", "--collective-timeout", "10"), tmp_path / f"node{node}.log") for node in (0, 1)]
    frozen = []
    try:
        wait_for(lambda: (read_heartbeat(out) or {}).get("step", 0) >= 2, 180, proc=agents[0])
        node0 = [_pids(out / "ranks" / f"{r}.pid") for r in (0, 1)]
        frozen = [agents[1].pid] + [_pids(out / "ranks" / f"{r}.pid") for r in (2, 3)]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        rc = agents[0].wait(timeout=120)
        waited = time.monotonic() - t0
        assert rc != 0 and not any(alive(p) for p in node0), (rc, node0)
        print(f"\nnode 0 ended {waited:.1f} s after node 1 froze (--collective-timeout 10)")
        assert waited < 90, waited  # the collective timeout (10 s) and torchrun's teardown, not 30 minutes
        hb = read_heartbeat(out)
        assert hb["phase"] == "failed", hb
        log0 = (tmp_path / "node0.log").read_text()
        assert "Timed out" in log0 or "timed out" in log0, log0[-3000:]
    finally:
        for pid in frozen:  # processes this test started and froze
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
            agent.wait(timeout=30)
