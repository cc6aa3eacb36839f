"""nvidia_userspace's backend in local mode with a small module stand-in: the no-driver skip, the one-line
refusals (unparsable version file, missing installer, flags that would build a kernel module), check mode. Nothing
here writes outside tmp_path (no installer runs: that path is tested in test_nvidia_userspace.py and in a real
container, tests/containers/test_nvidia_userspace_in_container.py)."""
import socket

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import nvidia_userspace_backend as nb
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure

LINE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024\n"


class Module:
    def __init__(self, check_mode=False, diff=False, **params):
        self.params = {k: v.get("default") for k, v in nb.argument_spec().argument_spec.items()}
        self.params.update(transport="local", **params)
        self.check_mode = check_mode
        self._diff = diff


def module(tmp_path, version_text=LINE, **kw):
    vf = tmp_path / "version"
    if version_text is not None:
        vf.write_text(version_text)
    params = dict(host_version_file=str(vf), installer_dir=str(tmp_path / "installers"),
                  staging_dir=str(tmp_path / "staging"), marker=str(tmp_path / "marker.json"))
    params.update(kw)
    return Module(**params)


def test_no_version_file_is_a_skip_with_the_message(tmp_path):
    out = nb.ensure_userspace(module(tmp_path, version_text=None))
    msg = "no NVIDIA driver on %s: nothing to install (CPU container)" % socket.gethostname()
    assert out == {"changed": False, "skipped": True, "msg": msg, "skip_reason": msg, "host_version": None,
                   "host_version_file": str(tmp_path / "version")}


def test_unparsable_version_file_is_one_line(tmp_path):
    with pytest.raises(ModuleFailure) as exc:
        nb.ensure_userspace(module(tmp_path, version_text="garbage\n"))
    assert str(exc.value) == ("cannot read the NVIDIA driver version from %s: first line 'garbage'; expected a line "
                              "like 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  …'"
                              % (tmp_path / "version"))


def test_missing_installer_is_refused_naming_the_file_and_nothing_is_prepared(tmp_path):
    with pytest.raises(ModuleFailure) as exc:
        nb.ensure_userspace(module(tmp_path))
    path = tmp_path / "installers" / "NVIDIA-Linux-x86_64-550.127.05.run"
    assert str(exc.value) == ("the installer of driver 550.127.05 is not there: put %s on the Proxmox host (or set "
                              "installer_dir), then run this again" % path)
    assert exc.value.facts["installer_present"] is False and "changed" not in exc.value.facts
    assert not (tmp_path / "staging").exists()


def test_check_mode_reports_the_install_without_the_installer(tmp_path):
    out = nb.ensure_userspace(module(tmp_path, check_mode=True, diff=True))
    assert out["changed"] and not out["installed"] and not out["installer_present"]
    assert out["host_version"] == "550.127.05" and out["host_module"] == "proprietary"
    assert out["diff"] == {"before": {"versions": out["previous_versions"]}, "after": {"versions": ["550.127.05"]}}
    assert not (tmp_path / "staging").exists()


@pytest.mark.parametrize("args", [[], ["--silent"], ["--no-kernel-module-source", "--silent"]])
def test_flags_that_would_build_a_kernel_module_are_refused(tmp_path, args):
    with pytest.raises(ModuleFailure, match="installer_args must contain --no-kernel-module"):
        nb.ensure_userspace(module(tmp_path, installer_args=args))


@pytest.mark.parametrize("key,value", [("staging_dir", "/tmp"), ("staging_dir", "/"), ("marker", "rel/m.json")])
def test_paths_of_their_own(tmp_path, key, value):
    with pytest.raises(ModuleFailure, match="%s must be an absolute path of its own" % key):
        nb.ensure_userspace(module(tmp_path, **{key: value}))


def test_the_default_flags_leave_the_kernel_module_out():
    default = nb.argument_spec().argument_spec["installer_args"]["default"]
    assert default == nb.INSTALLER_ARGS and "--no-kernel-module" in default and "--silent" in default
