"""The nvidia_userspace role through the real chain (ansible-playbook -> ssh -tt -> pct push/exec -> LXC).

The host's driver is a stand-in version file (a test-only path, nvidia_userspace_host_version_file) and the
installer a stand-in NVIDIA-Linux-x86_64-<version>.run made here: a shell script that records the flags it was
given inside the container and drops libnvidia-ml.so.<version> as the real one would. NVML is not asked
(nvidia_userspace_verify=false: there is no GPU). The no-driver skip uses this machine's real, absent driver."""
import os
import re

import pytest

from harness.fixtures import REPO_ROOT

pytestmark = pytest.mark.containers
PLAY = REPO_ROOT / "tests" / "containers" / "playbooks" / "nvidia_userspace.yml"
CALLS = "/root/nvidia-installer-calls"
LIB = "/usr/lib/x86_64-linux-gnu"
INSTALL = "NVIDIA user space {}"
DETECT = "Read the host's driver version and the container's user space"
DEFAULT_FLAGS = "--no-kernel-module --no-drm --no-nouveau-check --no-x-check --silent --no-questions --ui=none"
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Tue Oct  8 03:22:07 UTC 2024\n"
OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build  (dvs-builder@U16-I3-B03-4-3)  "
        "Fri Aug 16 21:42:42 UTC 2024\n")
GCC = "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"


def stand_in_installer(directory, version):
    path = directory / f"NVIDIA-Linux-x86_64-{version}.run"
    path.write_text(f"""#!/bin/sh
# stand-in for NVIDIA's makeself installer: records its flags, replaces the user-space libraries
echo "$*" >> {CALLS}
rm -f {LIB}/libnvidia-ml.so.*
touch {LIB}/libnvidia-ml.so.{version}
ln -s libnvidia-ml.so.{version} {LIB}/libnvidia-ml.so.1
echo "installed {version}"
""")
    path.chmod(0o644)  # NVIDIA's is run with sh, not executed
    return path


def stand_in(tmp_path):
    installers = tmp_path / "installers"
    installers.mkdir()
    for version in ("550.127.05", "550.135"):
        stand_in_installer(installers, version)
    version_file = tmp_path / "nvidia-version"
    return version_file, {"nvidia_userspace_host_version_file": str(version_file),
                          "nvidia_userspace_installer_dir": str(installers), "nvidia_userspace_verify": False}


def install_task(r, version):
    return r.outcome(INSTALL.format(version)), r.task(INSTALL.format(version))


def test_install_once_noop_reinstall_on_a_new_host_version_and_missing_installer(play, make_container, tmp_path):
    ct = make_container(200)
    version_file, extra = stand_in(tmp_path)
    version_file.write_text(PROPRIETARY.format("550.127.05") + GCC)

    r1 = play(PLAY, extra, limit="ct200")
    outcome, res = install_task(r1, "550.127.05")
    assert r1.rc == 0 and outcome == "ok" and res["changed"] and res["installed"], (res, r1.stdout[-3000:])
    assert res["previous_versions"] == [] and res["installed_versions"] == ["550.127.05"], res
    assert ct.read(CALLS) == DEFAULT_FLAGS + "\n"  # once, with exactly the default flags
    assert ct.sh(f"ls {LIB} | grep libnvidia-ml").stdout.split() == ["libnvidia-ml.so.1",
                                                                        "libnvidia-ml.so.550.127.05"]
    marker = ct.read_json("/etc/dflash/nvidia-userspace.json")
    assert marker["version"] == "550.127.05" and marker["installer_args"] == DEFAULT_FLAGS.split(), marker
    assert ct.sh("ls -A /var/tmp/dflash-nvidia").stdout.strip() == ""  # the pushed installer is gone
    summary = r1.task("Summarize")["msg"]
    assert summary.startswith("CT 200: NVIDIA user space 550.127.05 installed (") and \
        "NVML verification skipped: nvidia_userspace_verify is false (stand-in driver)" in summary, summary

    r2 = play(PLAY, extra, limit="ct200")
    outcome, res = install_task(r2, "550.127.05")
    assert r2.rc == 0 and outcome == "ok" and res["changed"] is False and not res["installed"], res
    assert re.search(r"ct200\s*:\s*ok=\d+\s+changed=0\b", r2.stdout), r2.stdout[-1500:]
    assert ct.read(CALLS) == DEFAULT_FLAGS + "\n"  # not run again
    assert "already installed" in r2.task("Summarize")["msg"]

    version_file.write_text(OPEN.format("550.135") + GCC)  # the host's driver was upgraded (open module)
    r3 = play(PLAY, extra, limit="ct200")
    outcome, res = install_task(r3, "550.135")
    assert r3.rc == 0 and outcome == "ok" and res["changed"] and res["installed"], (res, r3.stdout[-3000:])
    assert res["previous_versions"] == ["550.127.05"] and res["installed_versions"] == ["550.135"], res
    assert res["host_module"] == "open"
    assert ct.read(CALLS) == (DEFAULT_FLAGS + "\n") * 2

    version_file.write_text(PROPRIETARY.format("560.35.03") + GCC)  # no installer for this one
    r4 = play(PLAY, extra, limit="ct200")
    outcome, res = install_task(r4, "560.35.03")
    missing = tmp_path / "installers" / "NVIDIA-Linux-x86_64-560.35.03.run"
    assert r4.rc != 0 and outcome == "failed", r4.stdout[-3000:]
    assert res["msg"] == (f"the installer of driver 560.35.03 is not there: put {missing} on the Proxmox host "
                          "(or set installer_dir), then run this again"), res["msg"]
    assert ct.read(CALLS) == (DEFAULT_FLAGS + "\n") * 2  # nothing ran, 550.135 stays
    assert ct.sh(f"ls {LIB} | grep libnvidia-ml.so.5").stdout.split() == ["libnvidia-ml.so.550.135"]
    print(f"\n[harness] nvidia_userspace: install {r1.seconds:.1f}s, no-op {r2.seconds:.1f}s, "
          f"reinstall {r3.seconds:.1f}s, refusal {r4.seconds:.1f}s")


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="this machine has an NVIDIA driver")
def test_no_driver_on_the_host_skips_with_the_message(play, make_container):
    ct = make_container(200)
    r = play(PLAY, {}, limit="ct200")  # the real /proc/driver/nvidia/version: absent here
    assert r.rc == 0, r.stdout[-3000:]
    assert r.outcome(DETECT) == "skipped", r.stdout[-3000:]
    msg = r.task("Say why nothing is installed")["msg"]
    assert re.fullmatch(r"no NVIDIA driver on \S+: nothing to install \(CPU container\)", msg), msg
    assert r.outcome(INSTALL.format("")) == "skipped" and r.outcome("Summarize") == "skipped"
    assert re.search(r"ct200\s*:\s*ok=\d+\s+changed=0\b", r.stdout), r.stdout[-1500:]
    assert ct.read("/etc/dflash/nvidia-userspace.json") is None
