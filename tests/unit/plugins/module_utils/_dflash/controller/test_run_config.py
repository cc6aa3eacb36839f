"""Run names, the trainer argv and the fingerprint."""
import posixpath
import re

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import run_config as rc
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.training_backend import argument_spec


def params(**given):
    """What AnsibleModule hands the backend: every option, defaults from the one argument spec."""
    out = argument_spec().defaults()
    out.update(given)
    return out


def test_trainer_argv_rules():
    argv = rc.trainer_argv(["/opt/t"], {"lr": 6e-4, "use_soft_labels": True, "split": False, "x": None,
                                         "target_gpus": [0, 1, 2], "noise": "uniform", "neg": -1})
    assert argv == ["/opt/t", "--lr=0.0006", "--neg=-1", "--noise=uniform", "--target-gpus=0,1,2",
                    "--use-soft-labels"]


def test_empty_gpu_list_is_an_empty_value():
    assert rc.trainer_argv(["t"], {"target_gpus": []}) == ["t", "--target-gpus="]


@pytest.mark.parametrize("args,msg", [({"a b": 1}, "invalid trainer flag"), ({"-x": 1}, "invalid trainer flag"),
                                      ({"x\n": 1}, "invalid trainer flag"),
                                      ({"m": {"a": 1}}, "mapping value")])
def test_bad_trainer_args(args, msg):
    with pytest.raises(ValueError, match=msg):
        rc.trainer_argv(["t"], args)


def test_fingerprint_changes_with_config_not_with_secret_values():
    base = rc.fingerprint(["t", "--lr=1"], {"A": "1"}, [0, 1], ["K"], None)
    assert base == rc.fingerprint(["t", "--lr=1"], {"A": "1"}, [1, 0], ["K"], None)
    assert base != rc.fingerprint(["t", "--lr=2"], {"A": "1"}, [0, 1], ["K"], None)
    assert base != rc.fingerprint(["t", "--lr=1"], {"A": "2"}, [0, 1], ["K"], None)
    assert base != rc.fingerprint(["t", "--lr=1"], {"A": "1"}, [0], ["K"], None)
    assert base != rc.fingerprint(["t", "--lr=1"], {"A": "1"}, [0, 1], [], None)


def test_request_defaults_and_checks():
    req = rc.build_request(params(name="r", command=["t"], state="restarted"))
    assert req["run_dir"] == "/workspace/runs/r" and req["action"] == "restarted" and req["argv"] == ["t"]
    assert req["stop_timeout"] == 120 and req["lock_timeout"] == 900 and req["diff"] is False
    with pytest.raises(ValueError, match="gpus"):
        rc.build_request(params(name="r", command=["t"], gpus=[-1]))
    with pytest.raises(ValueError, match="absolute"):
        rc.build_request(params(name="r", command=["t"], run_dir="rel"))
    with pytest.raises(ValueError, match="{index}"):
        rc.build_request(params(name="r", command=["t"], gpu_device_pattern="/dev/nvidia0"))
    status = rc.build_request(params(name="r", state="status"))
    assert "argv" not in status


def test_request_carries_every_lifecycle_option():
    # The lifecycle reads these keys; a spec option renamed without build_request following would KeyError.
    req = rc.build_request(params(name="r", command=["t"], settle_time=2.5, phase_timeout=7.0), diff=True)
    assert req["settle_time"] == 2.5 and req["phase_timeout"] == 7.0 and req["diff"] is True


@pytest.mark.parametrize("root", ["/", "/etc", "/usr/", "/var", "/root", "/run", "/lib64", "//etc/./", "/proc"])
def test_runs_root_that_is_a_system_directory_is_refused(root):
    with pytest.raises(ValueError, match=r"^runs_root %s is a system directory; give the runs a directory of their "
                                         r"own \(e\.g\. dflash_runs_root=/workspace/runs\)$" % re.escape(posixpath.normpath(root))):
        rc.build_request(params(name="r1", runs_root=root, command=["t"]))


@pytest.mark.parametrize("root", ["/etc/dflash", "/var/lib/runs", "/workspace/runs", "/tmp"])
def test_runs_root_below_a_system_directory_is_allowed(root):
    assert rc.build_request(params(name="r1", runs_root=root, command=["t"]))["run_dir"] == root + "/r1"


def test_run_dir_option_that_is_a_system_directory_is_refused():
    with pytest.raises(ValueError, match="^run_dir /etc is a system directory"):
        rc.build_request(params(name="r1", runs_root="/workspace/runs", run_dir="/etc", command=["t"]))


@pytest.mark.parametrize("where", ["env", "secret_env"])
@pytest.mark.parametrize("var", ["DFLASH_RUN_DIR", "DFLASH_RUN_NAME"])
def test_env_cannot_set_the_run_directory(where, var):
    with pytest.raises(ValueError, match="^the run's env sets %s, which the lifecycle sets itself" % var):
        rc.build_request(params(name="r1", command=["t"], **{where: {var: "/etc"}}))


# --- a stopped container: a stop has nothing to do, a status says so (issue 20, item 4) --------------------------

class _Module(object):
    check_mode = False
    _diff = False

    def __init__(self, **params):
        self.params = params

    def warn(self, msg):
        raise AssertionError(msg)


def _stopped_container_pct(tmp_path):
    pct = tmp_path / "pct"
    pct.write_text("#!/bin/sh\necho \"container '$2' not running!\" >&2\nexit 255\n")
    pct.chmod(0o755)
    return str(pct)


@pytest.mark.parametrize("state", ["stopped", "status"])
def test_stop_and_status_in_a_stopped_container(tmp_path, state):
    from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import training_backend
    res = training_backend.manage_run(_Module(**params(name="r1", state=state, transport="pct", vmid=201,
                                                        pct_path=_stopped_container_pct(tmp_path))))
    assert res["changed"] is False and res["state"] == "container stopped" and res["alive"] is False
    assert "container 201 is not running" in res["container_note"]


def test_a_restart_in_a_stopped_container_still_fails(tmp_path):
    from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import training_backend
    from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
    with pytest.raises(ModuleFailure, match="container 201 is not running: start it with `pct start 201`"):
        training_backend.manage_run(_Module(**params(name="r1", state="restarted", transport="pct", vmid=201,
                                                     command=["t"], pct_path=_stopped_container_pct(tmp_path))))
