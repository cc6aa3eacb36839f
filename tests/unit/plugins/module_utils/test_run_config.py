"""Run names, the trainer argv and the fingerprint."""
import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash import run_config as rc


@pytest.mark.parametrize("name", ["slammed5", "a", "A.b_c-d", "x" * 64])
def test_good_run_names(name):
    assert rc.validate_run_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 65, "a b", "a/b", "..", ".", "$(id)", "a;b", "é", None, 5])
def test_bad_run_names(name):
    with pytest.raises(ValueError, match="invalid run name"):
        rc.validate_run_name(name)


def test_trainer_argv_rules():
    argv = rc.trainer_argv(["/opt/t"], {"lr": 6e-4, "use_soft_labels": True, "split": False, "x": None,
                                         "target_gpus": [0, 1, 2], "noise": "uniform", "neg": -1})
    assert argv == ["/opt/t", "--lr=0.0006", "--neg=-1", "--noise=uniform", "--target-gpus=0,1,2",
                    "--use-soft-labels"]


def test_empty_gpu_list_is_an_empty_value():
    assert rc.trainer_argv(["t"], {"target_gpus": []}) == ["t", "--target-gpus="]


@pytest.mark.parametrize("args,msg", [({"a b": 1}, "invalid trainer flag"), ({"-x": 1}, "invalid trainer flag"),
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
    req = rc.build_request({"name": "r", "command": ["t"], "state": "restarted"})
    assert req["run_dir"] == "/workspace/runs/r" and req["action"] == "restarted" and req["argv"] == ["t"]
    with pytest.raises(ValueError, match="gpus"):
        rc.build_request({"name": "r", "command": ["t"], "gpus": [-1]})
    with pytest.raises(ValueError, match="absolute"):
        rc.build_request({"name": "r", "command": ["t"], "run_dir": "rel"})
    status = rc.build_request({"name": "r", "state": "status"})
    assert "argv" not in status
