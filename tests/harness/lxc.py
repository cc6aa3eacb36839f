"""Thin wrappers around the lxc-* tools (LXC 5.0, privileged containers under /var/lib/lxc)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

LXC_PATH = Path("/var/lib/lxc")

# NEVER `lxc.net.0.type = none`: it shares the host's network namespace and the container's DHCP client
# then flushes the host's eth0 address. `empty` gives the container a loopback only.
BASE_CONFIG = """\
lxc.apparmor.profile = unconfined
lxc.net.0.type = empty
"""


def available() -> str | None:
    """Return a reason why real containers cannot be used here, or None."""
    if os.geteuid() != 0:
        return "real-container tests need root (lxc-create, lxc-attach, sshd as root)"
    for tool in ("lxc-create", "lxc-copy", "lxc-attach", "lxc-destroy", "lxc-info"):
        if shutil.which(tool) is None:
            return f"{tool} not found: run tests/harness/setup.sh (apt-get install lxc debootstrap openssh-server)"
    if shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists():
        return "sshd not found: run tests/harness/setup.sh"
    return None


def run(*argv: str, check: bool = True, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, timeout=timeout, text=True,
                          stdout=kw.pop("stdout", subprocess.PIPE), stderr=kw.pop("stderr", subprocess.PIPE), **kw)


def exists(name: str) -> bool:
    return (LXC_PATH / name / "config").exists()


def state(name: str) -> str:
    """RUNNING, STOPPED, ... ; 'MISSING' when the container does not exist."""
    if not exists(name):
        return "MISSING"
    p = run("lxc-info", "-n", name, "-sH", check=False)
    return p.stdout.strip() or "UNKNOWN"


def start(name: str) -> None:
    run("lxc-start", "-n", name)
    run("lxc-wait", "-n", name, "-s", "RUNNING", "-t", "30")


def stop(name: str, kill: bool = False) -> None:
    if state(name) == "RUNNING":
        run("lxc-stop", "-n", name, *(["-k"] if kill else ["-t", "10"]), check=False)


def destroy(name: str) -> None:
    if exists(name):
        run("lxc-destroy", "-f", "-n", name, check=False, timeout=120)


def rootfs(name: str) -> Path:
    """Host path of a running or stopped container's root file system as the container sees it."""
    # Snapshot (overlayfs) clones are only merged while running; use /proc/<init pid>/root then.
    pid = init_pid(name)
    if pid:
        return Path(f"/proc/{pid}/root")
    return LXC_PATH / name / "rootfs"


def init_pid(name: str) -> int | None:
    p = run("lxc-info", "-n", name, "-pH", check=False)
    out = p.stdout.strip()
    return int(out) if out.isdigit() else None


# lxc-attach re-executes itself from a memfd before it does anything; on this host that step has failed at
# random ("Device or resource busy - Failed to rexec as memfd", then glibc's abort: exit -6; once in a CI run,
# writing a file into a fresh clone). The command never ran, so running lxc-attach again is safe.
REXEC_FAILURE = "Failed to rexec as memfd"
REXEC_RETRIES = 2


def attach(name: str, *cmd: str, check: bool = True, timeout: float = 600, env: dict | None = None,
           input: str | None = None) -> subprocess.CompletedProcess:
    argv = ["lxc-attach", "-n", name, "--clear-env"]
    base_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                "LANG": "C.UTF-8"}
    base_env.update(env or {})
    for k, v in base_env.items():
        argv += ["-v", f"{k}={v}"]
    argv += ["--", *cmd]
    for _ in range(REXEC_RETRIES + 1):
        p = subprocess.run(argv, check=False, timeout=timeout, text=True, input=input,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=None if input is not None else subprocess.DEVNULL)
        if not (p.returncode < 0 and REXEC_FAILURE in p.stderr):
            break
    if check and p.returncode != 0:
        raise RuntimeError(f"in container {name}: {cmd!r} exited {p.returncode}\n"
                           f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}")
    return p


def sh(name: str, script: str, **kw) -> subprocess.CompletedProcess:
    return attach(name, "/bin/sh", "-c", script, **kw)


def wait_ready(name: str, timeout: float = 30) -> None:
    """Wait until the container's init is up enough for lxc-attach to work."""
    deadline = time.monotonic() + timeout
    while True:
        p = attach(name, "/bin/true", check=False, timeout=10)
        if p.returncode == 0:
            # Let the container's systemd finish booting: systemd-tmpfiles empties /tmp during boot, which
            # would silently delete what a test puts there right after start.
            while time.monotonic() < deadline:
                st = attach(name, "/bin/sh", "-c", "command -v systemctl >/dev/null || { echo running; exit; }; "
                            "systemctl is-system-running 2>/dev/null", check=False, timeout=10).stdout.strip()
                if st in ("running", "degraded"):
                    return
                time.sleep(0.1)
            raise RuntimeError(f"container {name} did not finish booting within {timeout}s (state {st!r})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"container {name} not attachable: {p.stderr}")
        time.sleep(0.2)


def clone(golden: str, name: str, snapshot: bool = True) -> float:
    """Clone `golden` (stopped) into `name`; returns seconds taken."""
    t0 = time.monotonic()
    destroy(name)
    argv = ["lxc-copy", "-n", golden, "-N", name]
    if snapshot:
        argv += ["-s", "-B", "overlayfs"]
    run(*argv, timeout=300)
    return time.monotonic() - t0
