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


def test_the_shutdown_timeout_is_part_of_the_fingerprint():
    a, b = request(nproc_per_node=2, stop_timeout=60), request(nproc_per_node=2, stop_timeout=600)
    assert a["fingerprint"] != b["fingerprint"]


@pytest.mark.parametrize("given,msg", [
    (dict(nproc_per_node=7, trainer_args={"target_gpus": [0, 1, 2, 3, 4], "drafter_gpus": [5, 6, 7]}),
     r"nproc_per_node is 7 but trainer_args target_gpus \[0, 1, 2, 3, 4\] \+ drafter_gpus \[5, 6, 7\] name 8 ranks "
     r"\(one per GPU\): set nproc_per_node to 8"),
    (dict(nproc_per_node=0), "nproc_per_node must be 1 .* or more"),
    (dict(nproc_per_node=2, command=["dflash-train"]), "must be an absolute path in its virtual environment"),
    (dict(nproc_per_node=2, command=[]), "command must be a non-empty list"),
])
def test_refusals_before_anything_runs(given, msg):
    with pytest.raises(ValueError, match=msg):
        request(**given)
