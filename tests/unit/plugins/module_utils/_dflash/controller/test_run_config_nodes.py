"""A torchrun job over several hosts (training_run's nodes): torchrun's multi-node command line, the job's one
fingerprint on every node, the rendezvous id per restart, and the refusals before anything runs."""
import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import run_config as rc
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.training_backend import argument_spec

NODES = [{"address": "10.0.0.1", "nproc_per_node": 2}, {"address": "10.0.0.2", "nproc_per_node": 1}]


def request(**given):
    p = argument_spec().defaults()
    p.update(name="r1", state="restarted", command=["/opt/dflash/venv/bin/dflash-train"], nodes=NODES, node=0,
             job_step="launch", job_token="abc123", trainer_args={"target_ranks": 1, "run_dir": "/w/r1"})
    p.update(given)
    return rc.build_request(p)


def test_each_node_runs_its_own_ranks_of_one_job_with_one_fingerprint():
    n0, n1 = request(node=0), request(node=1, rdzv_port=29500)
    assert n0["fingerprint"] != request(node=0, trainer_args={"target_ranks": 2})["fingerprint"]
    # node 1 with another rdzv port is another job; the same port: the same job, whatever node asks
    assert request(node=1)["fingerprint"] == n0["fingerprint"] != n1["fingerprint"]
    head = ["/opt/dflash/venv/bin/python", "-m", "torch.distributed.run", "--nnodes=2", "--node-rank=1",
            "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500", "--rdzv-id=r1-%s-abc123" % n1["fingerprint"],
            "--rdzv-conf=join_timeout=120,is_host=0", "--max-restarts=0", "--local-addr=10.0.0.2",
            "--nproc-per-node=1"]
    assert n1["argv"][:len(head)] == head
    assert "--rdzv-conf=join_timeout=120,is_host=1" in n0["argv"] and "--nproc-per-node=2" in n0["argv"]
    assert n1["job"]["first_rank"] == 2 and n1["job"]["world_size"] == 3 and n1["job"]["nodes"] == NODES


def test_another_restart_is_another_rendezvous_of_the_same_job():
    a, b = request(job_token="one"), request(job_token="two")
    assert a["fingerprint"] == b["fingerprint"] and a["argv"] != b["argv"]


@pytest.mark.parametrize("given,message", [
    ({"nodes": list(reversed(NODES))}, "not in the order torchrun numbers them"),
    ({"node": 2}, "node must be this host's index in nodes (0 to 1), got 2"),
    ({"nodes": [NODES[0], dict(NODES[1], address="10.0.0.1")]}, "name the address 10.0.0.1 twice"),
    ({"nodes": [NODES[0], {"address": "10.0.0.2; reboot", "nproc_per_node": 1}]}, "nodes[1] must be"),
    ({"nodes": [NODES[0], dict(NODES[1], nproc_per_node=0)]}, "nodes[1].nproc_per_node must be a whole number"),
    ({"job_token": "a b"}, "job_token must be 1-32 letters and digits"),
    ({"job_step": None}, "job_step must be one of reserve, stop, launch, verify, release"),
    ({"rdzv_port": 70000}, "rdzv_port must be a TCP port"),
])
def test_refusals(given, message):
    with pytest.raises(ValueError) as exc:
        request(**given)
    assert message in str(exc.value)
