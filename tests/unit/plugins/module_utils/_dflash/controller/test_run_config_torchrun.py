"""A run as a torchrun job (nproc_per_node > 1): torchrun's command line, the trainer check's command line, the job
record before the check fills it in, refusals. The world layout is the trainer's rule, asked of the installed
trainer in the container (tests/integration/test_training_run_torchrun_local.py, tests/containers/
test_trainer_check_in_container.py); this side holds no copy (test_one_rule_per_owner.py)."""
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
    assert req["check_argv"] == command + ["--check", "--drafter-gpus=5,6,7", "--target-gpus=0,1,2,3,4"]
    job = req["job"]
    assert job["nproc_per_node"] == 8 and job["shutdown_timeout_s"] == 600
    assert job["layout"] is None and job["ranks_dir"] is None  # the trainer's answer, filled in by its check


def test_one_process_checks_the_same_flags():
    req = request(trainer_args={"lr": 1, "use_soft_labels": True})
    assert req["check_argv"] == ["/opt/dflash/venv/bin/dflash-train", "--check", "--lr=1", "--use-soft-labels"]


def test_the_shutdown_timeout_is_part_of_the_fingerprint():
    a, b = request(nproc_per_node=2, stop_timeout=60), request(nproc_per_node=2, stop_timeout=600)
    assert a["fingerprint"] != b["fingerprint"]


@pytest.mark.parametrize("given,msg", [
    (dict(nproc_per_node=0), "nproc_per_node must be 1 .* or more"),
    (dict(nproc_per_node=2, command=["dflash-train"]), "must be an absolute path in its virtual environment"),
    (dict(nproc_per_node=2, command=[]), "command must be a non-empty list"),
])
def test_refusals_before_anything_runs(given, msg):
    with pytest.raises(ValueError, match=msg):
        request(**given)
