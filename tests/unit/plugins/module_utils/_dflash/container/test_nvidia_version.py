"""The host driver version parser, on /proc/driver/nvidia/version as several driver generations write it."""
import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.nvidia_version import (
    DriverVersionError, installer_name, library_version, parse_driver_version)

GCC = "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"


@pytest.mark.parametrize("first_line,version,arch,is_open", [
    # proprietary kernel module, production branches
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024",
     "550.127.05", "x86_64", False),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024",
     "535.183.01", "x86_64", False),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.256.02  Thu May  2 14:37:44 UTC 2024",
     "470.256.02", "x86_64", False),
    # legacy branches: two-part versions
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157  Wed Oct 12 09:19:07 UTC 2022",
     "390.157", "x86_64", False),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  340.108  Wed Dec 11 15:11:01 PST 2019",
     "340.108", "x86_64", False),
    # open kernel modules (the only choice for Blackwell; default from 560 on)
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  "
     "(dvs-builder@U16-I3-B03-4-3)  Fri Aug 16 21:42:42 UTC 2024", "560.35.03", "x86_64", True),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  "
     "(dvs-builder@U22-I3-AE18-23-3)  Wed Apr  9 18:40:10 UTC 2025", "570.133.20", "x86_64", True),
    # read from a real H200 host (the driver built by Nix: an empty builder name)
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  ",
     "580.159.04", "x86_64", True),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  575.57.08  Release Build  "
     "(dvs-builder@U22-I3-AF03-09-1)  Sat May 24 07:02:38 UTC 2025", "575.57.08", "aarch64", True),
    ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.90.07  Fri May 31 09:28:44 UTC 2024",
     "550.90.07", "aarch64", False),
    # a tab instead of spaces, trailing spaces, no date
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module\t550.54.15\t", "550.54.15", "x86_64", False),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06", "580.65.06", "x86_64", False),
])
def test_parses_the_nvrm_line(first_line, version, arch, is_open):
    assert parse_driver_version(first_line + "\n" + GCC) == {"version": version, "arch": arch, "open": is_open}


@pytest.mark.parametrize("text,says", [
    ("", "it is empty"),
    ("\n", "it is empty"),
    (GCC, "first line 'GCC version:"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  unknown  Tue Oct 8 2024\n", "first line 'NVRM"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05beta\n", "first line 'NVRM"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550\n", "first line"),
    ("NVRM version: nouveau 1.0\n", "first line"),
])
def test_unparsable_is_one_line_naming_the_file(text, says):
    with pytest.raises(DriverVersionError) as exc:
        parse_driver_version(text, source="/srv/version")
    msg = str(exc.value)
    assert msg.startswith("cannot read the NVIDIA driver version from /srv/version: ") and says in msg, msg
    assert "\n" not in msg


def test_a_very_long_line_is_cut_in_the_message():
    msg = str(pytest.raises(DriverVersionError, parse_driver_version, "x" * 5000).value)
    assert len(msg) < 400


@pytest.mark.parametrize("version,arch,name", [
    ("550.127.05", "x86_64", "NVIDIA-Linux-x86_64-550.127.05.run"),
    ("390.157", "x86_64", "NVIDIA-Linux-x86_64-390.157.run"),
    ("575.57.08", "aarch64", "NVIDIA-Linux-aarch64-575.57.08.run"),
])
def test_installer_name(version, arch, name):
    assert installer_name(version, arch) == name


@pytest.mark.parametrize("bad", ["", "550", "550.127.05; rm -rf /", "../550.1", None])
def test_installer_name_refuses_what_is_not_a_version(bad):
    with pytest.raises(DriverVersionError):
        installer_name(bad)


@pytest.mark.parametrize("file_name,version", [
    ("libnvidia-ml.so.550.127.05", "550.127.05"),
    ("libnvidia-ml.so.390.157", "390.157"),
    ("libnvidia-ml.so.1", None),
    ("libnvidia-ml.so", None),
    ("libnvidia-ml.so.550.127.05.bak", None),
    ("libcuda.so.550.127.05", None),
])
def test_library_version(file_name, version):
    assert library_version(file_name) == version
