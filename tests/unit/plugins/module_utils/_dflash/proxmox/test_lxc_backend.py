"""proxmox_lxc's backend: what is refused before any API call (the API factory must not even be called), and the
spec's shape. Everything that talks HTTP is tested against the PVE API stand-in in tests/containers/test_proxmox_lxc.py
(no mock of proxmoxer)."""
import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox import api, lxc_backend

HOST = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]


class Module:
    def __init__(self, **params):
        self.params = lxc_backend.argument_spec().defaults()
        self.params.update(api_host="pve.invalid", api_password="x", node="pve1", vmid=200)
        self.params.update(params)
        self.check_mode = False
        self._diff = False


def no_api(params):
    raise AssertionError("the API was called")


@pytest.mark.parametrize("params,msg", [
    (dict(memory=65536, weights_gib=54.5, shm_margin=0.1, trainer_memory_gib=24),
     "memory 65536 MiB < /dev/shm 60 GiB + trainer 24 GiB = 86016 MiB"),
    (dict(gpus=[0]), "gpus needs host_devices"),
    (dict(gpus=[2], host_devices=HOST), "/dev/nvidia2 not on the host (it has GPUs 0,1)"),
    (dict(weights_gib=10, shm_margin=-1), "shm_margin must be 0 or more"),
])
def test_refused_before_any_api_call(params, msg):
    with pytest.raises(ModuleFailure) as e:
        lxc_backend.manage_container(Module(**params), api_factory=no_api)
    assert str(e.value).startswith(msg) and "\n" not in str(e.value)


@pytest.mark.parametrize("params,who", [
    (dict(api_password="x"), "root@pam"),
    (dict(api_user="admin@pve", api_password="x"), "admin@pve"),
    (dict(api_password=None, api_token_id="root@pam!ci", api_token_secret="s"), "root@pam!ci"),
    (dict(api_password=None, api_user="root@pam", api_token_id="ci", api_token_secret="s"), "root@pam!ci"),
])
def test_the_caller_pve_sees(params, who):
    assert api.caller_name(Module(**params).params) == who


def test_no_credentials_is_one_line():
    with pytest.raises(api.ApiError, match="no API credentials: set api_password"):
        api.Api(Module(api_password=None).params)


def test_secrets_are_no_log():
    spec = lxc_backend.argument_spec().argument_spec
    assert spec["api_password"]["no_log"] and spec["api_token_secret"]["no_log"]
    assert not spec["api_token_id"].get("no_log")


@pytest.mark.parametrize("text,expected", [("8.2.4", (8, 2, 4)), ("8.1", (8, 1)), ("7.4-3", (7, 4, 3))])
def test_version_tuple(text, expected):
    assert api.version_tuple(text) == expected
