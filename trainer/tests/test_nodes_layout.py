"""The layout rule over nodes (distributed/nodes.py, world.plan_layout): global rank -> (node, local rank) -> role
and device, for several node counts and GPU lists, the refusals of layouts that cannot work, the NCCL rule's device
identity (node, device), and `dflash-train --check`'s whole-job layout."""

import json

import pytest

from trainer_testlib import train_cmd
from dflash_trainer.config import StartupError, TrainConfig
from dflash_trainer.distributed.nodes import Nodes, check_placement, job_nodes
from dflash_trainer.distributed.world import data_backend, plan_layout


def _cfg(**kw):
    return TrainConfig(target_model="t", data_dir="d", output_dir="o", **kw)


def _rows(layout):
    """(rank, role, role_rank, node, local_rank, devices) of each row."""
    return [(r["rank"], r["role"], r["role_rank"], r["node"], r["local_rank"], r.get("devices", [r["device"]]))
            for r in layout]


# --- node sizes from the environment ---

@pytest.mark.parametrize("env,world,sizes", [
    ({}, 4, (4,)),                                                        # no torchrun variables: one host
    ({"LOCAL_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "1"}, 4, (4,)),        # --standalone
    ({"LOCAL_WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "2"}, 16, (8, 8)),     # torchrun --nnodes 2
    ({"LOCAL_WORLD_SIZE": "8"}, 24, (8, 8, 8)),                           # a check run by hand
    ({"DFLASH_NODE_RANKS": "2,1", "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "2"}, 3, (2, 1)),
])
def test_node_sizes(env, world, sizes):
    assert job_nodes(world, env).sizes == sizes


@pytest.mark.parametrize("env,world,words", [
    ({"DFLASH_NODE_RANKS": "2,2"}, 3, "DFLASH_NODE_RANKS='2,2' must list each node's rank count"),
    ({"DFLASH_NODE_RANKS": "2,x"}, 3, "adding up to WORLD_SIZE 3; fix it or unset it"),
    ({"LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2"}, 3,
     "the 2 nodes run different rank counts (this one 2 of WORLD_SIZE 3); run the same --nproc-per-node on every "
     "node or set DFLASH_NODE_RANKS"),
    ({"LOCAL_WORLD_SIZE": "two"}, 3, "LOCAL_WORLD_SIZE='two' is not a whole number"),
])
def test_node_sizes_refused(env, world, words):
    with pytest.raises(StartupError) as refused:
        job_nodes(world, env)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_a_rank_placed_elsewhere_than_torchrun_started_it_is_refused():
    nodes = Nodes((2, 1))
    check_placement(nodes, 2, {"GROUP_RANK": "1", "LOCAL_RANK": "0"})
    with pytest.raises(StartupError, match=r"torchrun started rank 2 as local rank 1 of node 0, but the job's 2 "
                                           r"node\(s\) of 2,1 rank\(s\) place it as local rank 0 of node 1; fix "
                                           r"DFLASH_NODE_RANKS"):
        check_placement(nodes, 2, {"GROUP_RANK": "0", "LOCAL_RANK": "1"})


# --- GPU lists: each node's, the same on every node ---

@pytest.mark.parametrize("count", [1, 2, 3])
def test_each_node_runs_the_lists_targets_first(count):
    """--target-gpus 0,1,2 --drafter-gpus 3: 3 target + 1 drafter ranks per node, for 1, 2 and 3 nodes."""
    cfg = _cfg(target_gpus=[0, 1, 2], drafter_gpus=[3])
    T, D, layout = plan_layout(cfg, 4 * count, cuda=True, nodes=Nodes((4,) * count))
    assert (T, D) == (3 * count, count)
    expected = []
    for node in range(count):
        expected += [(4 * node + i, "target", 3 * node + i, node, i, [f"cuda:{i}"]) for i in range(3)]
        expected += [(4 * node + 3, "drafter", node, node, 3, ["cuda:3"])]
    assert _rows(layout) == expected
    # the same device names on every node are still one GPU per rank: NCCL
    assert data_backend(layout) == "nccl"


def test_target_groups_over_two_nodes():
    """Layers of each target rank over 2 GPUs: per node 2 target ranks (GPUs 0-1, 2-3; GPU 4 idle) + 3 drafters."""
    cfg = _cfg(target_gpus=[0, 1, 2, 3, 4], drafter_gpus=[5, 6, 7])
    T, D, layout = plan_layout(cfg, 10, cuda=True, per_rank=2, nodes=Nodes((5, 5)))
    assert (T, D) == (4, 6)
    assert [(r["role"], r["node"], r.get("devices", [r["device"]])) for r in layout[3:7]] == [
        ("drafter", 0, ["cuda:6"]), ("drafter", 0, ["cuda:7"]),
        ("target", 1, ["cuda:0", "cuda:1"]), ("target", 1, ["cuda:2", "cuda:3"])]
    assert [r["role_rank"] for r in layout if r["role"] == "target"] == [0, 1, 2, 3]
    assert [r["rank"] for r in layout if r["role"] == "drafter"] == [2, 3, 4, 7, 8, 9]
    assert layout[0]["idle_gpus"] == [4]


def test_one_gpu_shared_by_two_ranks_of_a_node_goes_host_staged():
    """NCCL refuses two ranks on one device: GPU 0 for a target and a drafter rank of each node -> gloo; two nodes'
    cuda:0 alone do not count as shared."""
    _T, _D, layout = plan_layout(_cfg(target_gpus=[0], drafter_gpus=[0]), 4, cuda=True, nodes=Nodes((2, 2)))
    assert data_backend(layout) == "gloo"
    _T, _D, layout = plan_layout(_cfg(target_gpus=[0], drafter_gpus=[1]), 4, cuda=True, nodes=Nodes((2, 2)))
    assert data_backend(layout) == "nccl"


@pytest.mark.parametrize("cfg,world,nodes,words", [
    (dict(target_gpus=[0, 1], drafter_gpus=[2]), 6, (4, 2),
     "--target-gpus [0, 1] + --drafter-gpus [2] are each node's lists (3 ranks on every node), but the job's 2 "
     "node(s) of 4,2 rank(s); run --nproc-per-node 3 on every node"),
    (dict(target_gpus=[0, 1], drafter_gpus=[2]), 8, (4, 4),
     "--target-gpus [0, 1] + --drafter-gpus [2] make 2 + 1 ranks per node but torchrun started 4 on each of 2 "
     "nodes (WORLD_SIZE 8); pass --nproc-per-node 3 (on every node) or change the GPU lists"),
    (dict(target_gpus=[0, 1], drafter_gpus=[]), 4, (2, 2),
     "a torchrun job needs target and drafter GPUs; got --target-gpus [0, 1] --drafter-gpus []: list at least one "
     "GPU in each"),
])
def test_layouts_that_cannot_work_are_refused(cfg, world, nodes, words):
    with pytest.raises(StartupError) as refused:
        plan_layout(_cfg(**cfg), world, cuda=True, nodes=Nodes(nodes))
    assert str(refused.value) == words


def test_cpu_rehearsal_of_a_gpu_layout():
    """--device cpu with both lists: the GPU job's roles per node, every rank on the CPU (gloo)."""
    cfg = _cfg(device="cpu", target_gpus=[0], drafter_gpus=[1])
    T, D, layout = plan_layout(cfg, 4, cuda=False, nodes=Nodes((2, 2)))
    assert (T, D) == (2, 2)
    assert [(r["role"], r["node"], r["device"], r["rehearses"]) for r in layout] == [
        ("target", 0, "cpu", ["cuda:0"]), ("drafter", 0, "cpu", ["cuda:1"]),
        ("target", 1, "cpu", ["cuda:0"]), ("drafter", 1, "cpu", ["cuda:1"])]
    assert data_backend(layout) == "gloo"


def test_cpu_ranks_over_nodes_of_different_sizes():
    """On the CPU --target-ranks counts from rank 0 whatever the nodes; each row still names its node."""
    T, D, layout = plan_layout(_cfg(target_ranks=1), 3, cuda=False, nodes=Nodes((2, 1)))
    assert (T, D) == (1, 2)
    assert [(r["role"], r["role_rank"], r["node"], r["local_rank"]) for r in layout] == [
        ("target", 0, 0, 0), ("drafter", 0, 0, 1), ("drafter", 1, 1, 0)]


# --- dflash-train --check: the whole job ---

def _check(argv, env, capsys):
    """dflash-train --check's entry (preflight.main, as cli.main calls it) in this process, with `env` as the
    environment the collection gives it: (exit status, its JSON report, its stderr)."""
    from dflash_trainer.config import preflight
    rc = preflight.main(argv[3:], {"OMP_NUM_THREADS": "1", **env})
    out, err = capsys.readouterr()
    return rc, json.loads(out.splitlines()[0]), err


def test_check_reports_the_whole_jobs_layout(tiny, tmp_path, capsys):
    """What the collection asks (WORLD_SIZE, DFLASH_NODE_RANKS, GROUP_RANK) and what an operator types by hand
    (WORLD_SIZE, LOCAL_WORLD_SIZE): every rank's role, node and device; a layout that cannot work refused."""
    rc, report, err = _check(train_cmd(tiny, tmp_path / "out", "--target-ranks", "1"),
                             {"WORLD_SIZE": "3", "DFLASH_NODE_RANKS": "2,1", "GROUP_RANK": "1"}, capsys)
    assert rc == 0, err
    assert [(r["role"], r["node"], r["local_rank"]) for r in report["layout"]] == [
        ("target", 0, 0), ("drafter", 0, 1), ("drafter", 1, 0)]
    rehearsal = train_cmd(tiny, tmp_path / "out", "--device", "cpu", "--target-gpus", "0", "--drafter-gpus", "1")
    rc, report, err = _check(rehearsal, {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, capsys)
    assert rc == 0, err
    assert [(r["rank"], r["role"], r["node"], r["rehearses"]) for r in report["layout"]] == [
        (0, "target", 0, ["cuda:0"]), (1, "drafter", 0, ["cuda:1"]), (2, "target", 1, ["cuda:0"]), (3, "drafter", 1, ["cuda:1"])]
    rc, report, err = _check(rehearsal, {"WORLD_SIZE": "5", "DFLASH_NODE_RANKS": "2,3"}, capsys)
    assert rc == 2 and report["layout"] is None
    assert err.strip() == ("dflash-train: error: --target-gpus [0] + --drafter-gpus [1] are each node's lists (2 ranks "
                           "on every node), but the job's 2 node(s) of 2,3 rank(s); run --nproc-per-node 2 on every node")


def test_a_rank_whose_plan_differs_from_rank_0s_refuses():
    """Each node plans its layout itself; --target-gpus-per-rank 0 measures each node's free memory, so two nodes
    may plan differently: every rank compares its plan with rank 0's through the job's store."""
    import torch.distributed as dist

    from dflash_trainer.distributed.world import _agree_on_layout
    cfg = _cfg(target_gpus=[0, 1, 2], drafter_gpus=[3])
    _T, _D, split = plan_layout(cfg, 4, cuda=True, per_rank=2, nodes=Nodes((2, 2)))  # node 0: 2 GPUs per target
    store = dist.HashStore()
    _agree_on_layout(store, 0, split)
    _agree_on_layout(store, 1, split)  # the same plan: nothing to say
    # node 1 measured 1 GPU per target rank: its 4 ranks per node do not match node 0's 2
    _T, _D, whole = plan_layout(cfg, 8, cuda=True, per_rank=1, nodes=Nodes((4, 4)))
    with pytest.raises(StartupError) as refused:
        _agree_on_layout(store, 5, whole)
    message = str(refused.value)
    assert message.startswith("rank 5 (node 1) planned another layout than rank 0: 0:t@0/cuda:0+cuda:1 1:d@0/cuda:3 "
                              "2:t@1/cuda:0+cuda:1 3:d@1/cuda:3 there, 0:t@0/cuda:0 ") and \
        message.endswith("so every node splits alike") and "\n" not in message, message
