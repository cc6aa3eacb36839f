"""A run as a torchrun job (nproc_per_node > 1): torchrun's command line, launch.json's job record, refusals."""
import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import run_config as rc
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.training_backend import argument_spec

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1"]


def request(**given):
    p = argument_spec().defaults()
    p.update(name="r1", state="restarted", command=["/opt/dflash/venv/bin/dflash-train"])
    p.update(given)
    return rc.build_request(p)


def test_one_process_by_default_is_the_trainer_command_itself():
    req = request(trainer_args={"lr": 1})
    assert req["argv"] == ["/opt/dflash/venv/bin/dflash-train", "--lr=1"] and req["job"] is None


@pytest.mark.parametrize("command,head,tail", [
    # a venv's console script: the python beside it runs torchrun, torchrun runs the script
    (["/opt/dflash/venv/bin/dflash-train"], "/opt/dflash/venv/bin/python", ["/opt/dflash/venv/bin/dflash-train"]),
    # an interpreter with -m: the module goes to torchrun's own -m
    (["/usr/bin/python3", "-m", "dflash_trainer.cli"], "/usr/bin/python3", ["-m", "dflash_trainer.cli"]),
])
def test_torchrun_command_line(command, head, tail):
    req = request(command=command, nproc_per_node=8, stop_timeout=599.5,
                  trainer_args={"target_gpus": [0, 1, 2, 3, 4], "drafter_gpus": [5, 6, 7]})
    assert req["argv"] == [head] + TORCHRUN + ["--nproc-per-node=8", "--shutdown-timeout=600"] + tail + [
        "--drafter-gpus=5,6,7", "--target-gpus=0,1,2,3,4"]
    job = req["job"]
    assert job["nproc_per_node"] == 8 and job["shutdown_timeout_s"] == 600
    assert job["ranks_dir"] == "/workspace/runs/r1/ranks"  # no --run-dir: the run directory
    assert [(e["rank"], e["role"], e["gpu"]) for e in job["layout"]] == \
        [(r, "target", r) for r in range(5)] + [(r, "drafter", r) for r in range(5, 8)]


def test_layout_on_the_cpu_from_target_ranks_and_unknown_without_the_flags():
    job = request(nproc_per_node=3, trainer_args={"target_gpus": "", "drafter_gpus": [], "target_ranks": 2,
                                                  "run_dir": "/data/r1"})["job"]
    assert [e["role"] for e in job["layout"]] == ["target", "target", "drafter"]
    assert job["ranks_dir"] == "/data/r1/ranks"
    assert request(nproc_per_node=3)["job"]["layout"] is None  # the trainer's defaults decide; the heartbeat says


FIVE_THREE = {"target_gpus": [0, 1, 2, 3, 4], "drafter_gpus": [5, 6, 7]}


def rows(layout):
    return [(e["rank"], e["role"], e.get("gpu"), e.get("gpus")) for e in layout]


@pytest.mark.parametrize("per_rank,nproc,targets", [
    # groups of 2 consecutive GPUs, one target rank each; GPU 4 left idle (not a whole group), as the trainer does
    (2, 5, [(0, "target", 0, [0, 1]), (1, "target", 2, [2, 3])]),
    (5, 4, [(0, "target", 0, [0, 1, 2, 3, 4])]),
    (1, 8, [(r, "target", r, None) for r in range(5)]),
    # measured at start (0, or unset): only a group size of 2 makes 2 + 3 ranks of 5 target GPUs, so it is known
    (0, 5, [(0, "target", 0, [0, 1]), (1, "target", 2, [2, 3])]),
    (None, 8, [(r, "target", r, None) for r in range(5)]),
])
def test_split_target_ranks_span_groups_of_gpus(per_rank, nproc, targets):
    job = request(nproc_per_node=nproc, trainer_args=dict(FIVE_THREE, target_gpus_per_rank=per_rank))["job"]
    first = len(targets)
    assert rows(job["layout"]) == targets + [(first + i, "drafter", g, None) for i, g in enumerate([5, 6, 7])]
    assert len(job["layout"]) == nproc


def test_measured_group_size_that_the_rank_count_does_not_fix_records_roles_without_target_gpus():
    # 1 target rank + 3 drafters: the trainer may measure 3, 4 or 5 GPUs per target rank (5 // g == 1 for each)
    job = request(nproc_per_node=4, trainer_args=dict(FIVE_THREE, target_gpus_per_rank=0))["job"]
    assert rows(job["layout"]) == [(0, "target", None, None), (1, "drafter", 5, None), (2, "drafter", 6, None),
                                   (3, "drafter", 7, None)]
    assert "gpu" not in job["layout"][0]  # unknown, not "no GPU" (the CPU's gpu: null)


def test_device_cpu_ignores_the_gpu_lists_as_the_trainer_does():
    job = request(nproc_per_node=3, trainer_args=dict(FIVE_THREE, device="cpu", target_ranks=1))["job"]
    assert rows(job["layout"]) == [(0, "target", None, None), (1, "drafter", None, None), (2, "drafter", None, None)]


def test_the_shutdown_timeout_is_part_of_the_fingerprint():
    a, b = request(nproc_per_node=2, stop_timeout=60), request(nproc_per_node=2, stop_timeout=600)
    assert a["fingerprint"] != b["fingerprint"]


@pytest.mark.parametrize("given,msg", [
    (dict(nproc_per_node=7, trainer_args=dict(FIVE_THREE, target_gpus_per_rank=1)),
     r"^nproc_per_node is 7 but trainer_args target_gpus \[0, 1, 2, 3, 4\] \+ drafter_gpus \[5, 6, 7\] name 8 ranks "
     r"\(one per GPU\): set nproc_per_node to 8 or change the GPU lists$"),
    (dict(nproc_per_node=8, trainer_args=dict(FIVE_THREE, target_gpus_per_rank=2)),
     r"^nproc_per_node is 8 but trainer_args target_gpus \[0, 1, 2, 3, 4\] \+ drafter_gpus \[5, 6, 7\] name 5 ranks "
     r"\(target_gpus_per_rank 2, GPUs \[4\] idle\): set nproc_per_node to 5 or change the GPU lists$"),
    (dict(nproc_per_node=7, trainer_args=FIVE_THREE),
     r"^nproc_per_node is 7 but trainer_args .* name 8, 5 or 4 ranks \(target_gpus_per_rank unset or 0: GPUs per "
     r"target rank measured at start\): set nproc_per_node to 8, 5 or 4 or change the GPU lists$"),
    (dict(nproc_per_node=4, trainer_args=dict(FIVE_THREE, target_gpus_per_rank=6)),
     r"^trainer_args target_gpus_per_rank 6 does not fit target_gpus \[0, 1, 2, 3, 4\]: set it from 1 to 5"),
    (dict(nproc_per_node=4, trainer_args={"target_gpus": [0, 1], "drafter_gpus": ""}),
     r"^trainer_args target_gpus \[0, 1\] and drafter_gpus \[\]: a torchrun job needs at least one GPU in each"),
    (dict(nproc_per_node=3, trainer_args={"target_gpus": "", "drafter_gpus": "", "target_ranks": 3}),
     r"^trainer_args target_ranks 3 leaves 0 of nproc_per_node 3 ranks to the drafter: set target_ranks from 1 to 2"),
    (dict(nproc_per_node=0), "nproc_per_node must be 1 .* or more"),
    (dict(nproc_per_node=2, command=["dflash-train"]), "must be an absolute path in its virtual environment"),
    (dict(nproc_per_node=2, command=[]), "command must be a non-empty list"),
])
def test_refusals_before_anything_runs(given, msg):
    with pytest.raises(ValueError, match=msg):
        request(**given)
