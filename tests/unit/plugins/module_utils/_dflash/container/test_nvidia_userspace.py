"""The in-container side of nvidia_userspace on real files and a real (stand-in) installer: detect reads the
libnvidia-ml.so.<version> files, install runs the .run with its flags and proves the version, verify refuses
without NVML in one line. Also main()'s one JSON line."""
import io
import json
import os
from contextlib import redirect_stdout

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import nvidia_userspace as nu

ARGS = ["--no-kernel-module", "--silent", "--ui=none"]


def request(tmp_path, version="550.127.05", **kw):
    req = {"version": version, "installer": "NVIDIA-Linux-x86_64-%s.run" % version,
           "staging_dir": str(tmp_path / "staging"), "marker": str(tmp_path / "etc" / "marker.json"),
           "installer_args": ARGS, "installer_timeout": 30, "lib_dirs": [str(tmp_path / "lib")]}
    req.update(kw)
    return req


def stand_in_installer(tmp_path, version, drops=None, rc=0):
    """A .run stand-in: records its flags in <tmp>/calls, drops libnvidia-ml.so.<drops> into <tmp>/lib."""
    (tmp_path / "staging").mkdir(exist_ok=True)
    path = tmp_path / "staging" / ("NVIDIA-Linux-x86_64-%s.run" % version)
    path.write_text('#!/bin/sh\necho "$*" >> %s/calls\nmkdir -p %s/lib\nrm -f %s/lib/libnvidia-ml.so.*\n'
                    'touch %s/lib/libnvidia-ml.so.%s\necho "ERROR: stand-in says bye"\nexit %d\n'
                    % (tmp_path, tmp_path, tmp_path, tmp_path, drops or version, rc))
    return path


def test_detect_reads_library_file_names_not_the_marker(tmp_path):
    (tmp_path / "lib").mkdir()
    for name in ("libnvidia-ml.so.535.183.01", "libnvidia-ml.so.1", "libcuda.so.550.127.05"):
        (tmp_path / "lib" / name).touch()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "marker.json").write_text(json.dumps({"version": "550.127.05"}))
    out = nu.detect(request(tmp_path))
    assert out["installed_versions"] == ["535.183.01"] and out["up_to_date"] is False
    assert out["marker"] == {"version": "550.127.05"} and "staging" not in out
    assert not (tmp_path / "staging").exists()


def test_detect_prepares_the_staging_directory_only_when_needed(tmp_path):
    out = nu.detect(request(tmp_path, prepare=True))
    assert out["staging"] == str(tmp_path / "staging") and (tmp_path / "staging").is_dir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libnvidia-ml.so.550.127.05").touch()
    out = nu.detect(request(tmp_path, prepare=True, staging_dir=str(tmp_path / "other")))
    assert out["up_to_date"] and "staging" not in out and not (tmp_path / "other").exists()


def test_install_runs_the_installer_with_its_flags_and_writes_the_marker(tmp_path):
    installer = stand_in_installer(tmp_path, "550.127.05")
    out = nu.install(request(tmp_path))
    assert out["installed"] and out["installed_versions"] == ["550.127.05"]
    assert (tmp_path / "calls").read_text() == " ".join(ARGS) + "\n"
    assert not installer.exists()  # hundreds of MB: removed after the run
    marker = json.loads((tmp_path / "etc" / "marker.json").read_text())
    assert marker["version"] == "550.127.05" and marker["installer_args"] == ARGS


def test_a_failing_installer_is_one_line_and_leaves_no_marker(tmp_path):
    installer = stand_in_installer(tmp_path, "550.127.05", rc=3)
    with pytest.raises(nu.UserspaceError) as exc:
        nu.install(request(tmp_path))
    msg = str(exc.value)
    assert "NVIDIA-Linux-x86_64-550.127.05.run --no-kernel-module --silent --ui=none failed (exit 3)" in msg
    assert "ERROR: stand-in says bye" in msg and "\n" not in msg
    assert exc.value.facts["installer_output"][-1] == "ERROR: stand-in says bye"
    assert not installer.exists() and not (tmp_path / "etc" / "marker.json").exists()


def test_an_installer_of_another_version_is_caught(tmp_path):
    stand_in_installer(tmp_path, "550.127.05", drops="550.120")
    with pytest.raises(nu.UserspaceError, match=r"exited 0 but left no libnvidia-ml.so.550.127.05 \(found: 550.120\)"):
        nu.install(request(tmp_path))
    assert not (tmp_path / "etc" / "marker.json").exists()


def test_install_without_the_pushed_file(tmp_path):
    with pytest.raises(nu.UserspaceError, match="was not pushed into the container"):
        nu.install(request(tmp_path))


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="this machine has an NVIDIA driver")
def test_verify_without_nvml_is_one_line(tmp_path):
    with pytest.raises(nu.UserspaceError) as exc:
        nu.verify(request(tmp_path, expected_gpus=[0]))
    assert str(exc.value).startswith("NVML cannot be loaded in the container (") and "\n" not in str(exc.value)


def test_ldconfig_dirs_finds_libraries_outside_the_distribution_dirs():
    # `ldconfig -p` on an H200 machine whose driver libraries a container runtime put in /usr/local/nvidia/lib64
    text = ("1234 libs found in cache `/etc/ld.so.cache'\n"
            "\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ml.so.1\n"
            "\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/libnvidia-ml.so.1\n"
            "\tlibnvidia-ml.so (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ml.so\n"
            "\tlibcuda.so.1 (libc6,x86-64) => /opt/cuda/libcuda.so.1\n"
            "Cache generated by: ldconfig (GNU libc) stable release version 2.39\n")
    assert nu.ldconfig_dirs(text) == ["/usr/local/nvidia/lib64", "/lib"]
    assert nu.ldconfig_dirs("") == []


def test_library_dirs_start_with_the_distribution_dirs():
    assert nu.library_dirs()[:len(nu.LIB_DIRS)] == list(nu.LIB_DIRS)


def test_main_prints_one_json_line(tmp_path):
    buf = io.StringIO()
    with redirect_stdout(buf):
        nu.main(request(tmp_path, action="detect"))
    assert json.loads(buf.getvalue()) == {"installed_versions": [], "up_to_date": False, "marker": None}
    buf = io.StringIO()
    with redirect_stdout(buf):
        nu.main({"action": "nope"})
    assert json.loads(buf.getvalue()) == {"failed": True, "msg": "unknown action 'nope'"}


@pytest.mark.skipif(not os.path.exists("/proc/driver/nvidia/version"), reason="no NVIDIA driver on this machine")
def test_verify_on_a_real_gpu():
    """On a GPU machine (run on one H200, driver 580.159.04 open module: GPU 0 listed by minor, 0.02 s; a missing
    GPU and a wrong version refused): NVML through ctypes, against the real driver."""
    from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.nvidia_version import (
        parse_driver_version)
    with open("/proc/driver/nvidia/version") as fh:
        version = parse_driver_version(fh.read())["version"]
    seen = nu.verify({"version": version, "expected_gpus": []})
    assert seen["driver_version"] == version and seen["gpus"], seen
    first = seen["minors"][0]
    assert nu.verify({"version": version, "expected_gpus": [first]})["minors"] == seen["minors"]
    with pytest.raises(nu.UserspaceError, match=r"pass /dev/nvidia999 through"):
        nu.verify({"version": version, "expected_gpus": [999]})
    with pytest.raises(nu.UserspaceError, match="the host's kernel module is 1.2.3"):
        nu.verify({"version": "1.2.3", "expected_gpus": []})
