"""pytest fixtures of the real-container harness. Use from a conftest.py:

    from harness.fixtures import *  # noqa: F401,F403   (tests/ on sys.path)

Fixtures: golden (session), sshd (session), make_container (factory, function scope; destroys what it made),
ct200 (a running clone named 200 with the fake trainer), trainer_wheel (session), play (run a playbook through
ansible-runner over the harness ssh), harness_env, pve_api (a Proxmox API stand-in: the dict of its pve_api.json).
Every container and process a fixture starts is removed in a finalizer, also when the test fails.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from . import BIN_DIR, CT_VENV, CT_WHEELS, HARNESS_DIR, LOCK_DIR, REPO_ROOT, WHEEL_DIR, golden as golden_mod, lxc
from .sshd import Sshd

HARNESS_INVENTORY = REPO_ROOT / "inventories" / "harness" / "hosts.yml"
FAKE_TRAINER_CT = "/opt/dflash/fake_trainer.py"
VENV_BIN = Path(sys.executable).parent


def pytest_configure(config):
    config.addinivalue_line("markers", "containers: needs root + LXC; runs against real LXC containers")


@pytest.fixture(scope="session")
def containers_ok():
    reason = lxc.available()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def vmid_lock(containers_ok):
    """Containers are named after vmids (200, 201): one harness session at a time on this machine."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fh = open(LOCK_DIR / "vmids.lock", "w")
    fcntl.flock(fh, fcntl.LOCK_EX)
    yield
    fcntl.flock(fh, fcntl.LOCK_UN)
    fh.close()


@pytest.fixture(scope="session")
def golden(vmid_lock):
    t0 = time.monotonic()
    res = golden_mod.build()
    if res["built"]:
        print(f"\n[harness] built golden {res['name']} in {time.monotonic() - t0:.1f}s {res['timings']}")
    return res["name"]


@pytest.fixture(scope="session")
def trainer_wheel(tmp_path_factory):
    """The project's trainer/ built as a wheel (no deps) on the host, once per session."""
    src = REPO_ROOT / "trainer"
    if not (src / "pyproject.toml").exists():
        pytest.skip("trainer/ package not present in this checkout yet")
    out = tmp_path_factory.mktemp("trainer-wheel")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(out), str(src)], text=True, capture_output=True)
    if p.returncode != 0:
        pytest.fail(f"pip wheel trainer/ failed:\n{p.stdout}\n{p.stderr}")
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@dataclass
class Container:
    vmid: int
    clone_s: float = 0.0
    timings: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.vmid)

    def sh(self, script: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return lxc.sh(self.name, script, check=check, timeout=timeout)

    def pids(self, pattern: str) -> list[int]:
        """Pids inside the container whose full command line matches `pattern` (pgrep -f)."""
        p = lxc.attach(self.name, "pgrep", "-f", "--", pattern, check=False)
        return [int(x) for x in p.stdout.split()]

    def read(self, path: str) -> str | None:
        p = lxc.attach(self.name, "cat", "--", path, check=False)
        return p.stdout if p.returncode == 0 else None

    def read_json(self, path: str):
        t = self.read(path)
        return json.loads(t) if t else None

    def write(self, path: str, text: str, mode: str = "0644") -> None:
        lxc.attach(self.name, "sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"', "sh",
                   path, mode, input=text)

    def put(self, src: Path, dest: str) -> None:
        """Copy a host file into the running container (binary-safe, through lxc-attach's stdin)."""
        with open(src, "rb") as fh:
            subprocess.run(["lxc-attach", "-n", self.name, "--clear-env", "--", "/bin/sh", "-c",
                            'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", dest], stdin=fh, check=True,
                           timeout=120)

    def kill_matching(self, pattern: str) -> None:
        lxc.attach(self.name, "pkill", "-KILL", "-f", "--", pattern, check=False)

    def state(self) -> str:
        return lxc.state(self.name)


def _prepare_clone(gold: str, vmid: int, start: bool = True) -> Container:
    c = Container(vmid)
    c.clone_s = lxc.clone(gold, c.name)
    # the host's wheel cache, read-only, so the per-clone trainer install resolves deps offline; and renaming a
    # directory of the golden's (trainer_install adopting /opt/dflash/venv) is one step, as on a Proxmox rootfs (ZFS,
    # ext4), not overlayfs' EXDEV and a copy of the whole tree (40-55 s for the venv, and its teardown after)
    with open(lxc.LXC_PATH / c.name / "config", "a") as fh:
        fh.write(f"\n# dflash harness\nlxc.mount.entry = {WHEEL_DIR} {CT_WHEELS.lstrip('/')} none bind,ro,create=dir 0 0\n"
                 "lxc.rootfs.options = redirect_dir=on\n")
    if start:
        t0 = time.monotonic()
        lxc.start(c.name)
        lxc.wait_ready(c.name)
        c.timings["start"] = time.monotonic() - t0
        c.write(FAKE_TRAINER_CT, (HARNESS_DIR / "fake_trainer.py").read_text(), "0755")
    return c


def install_trainer(c: Container, wheel: Path) -> float:
    """pip install the project's trainer wheel into the golden venv of a running clone (offline)."""
    t0 = time.monotonic()
    c.put(wheel, f"/opt/dflash/{wheel.name}")
    c.sh(f"{CT_VENV}/bin/pip install -q --no-index --find-links {CT_WHEELS} /opt/dflash/{wheel.name} && "
         f"ln -sf {CT_VENV}/bin/dflash-train {CT_VENV}/bin/dflash-make-tiny /usr/local/bin/", timeout=600)
    return time.monotonic() - t0


TINY_DIR = "/workspace/tiny"  # inventories/harness/group_vars: target_model/data_dir point here


def make_tiny(c: Container) -> float:
    """A tiny random target + dataset inside the container (dflash-make-tiny from the installed trainer)."""
    t0 = time.monotonic()
    c.sh(f"dflash-make-tiny --target-dir {TINY_DIR}/target --data-dir {TINY_DIR}/data >/dev/null 2>&1 || "
         f"dflash-make-tiny --target-dir {TINY_DIR}/target --data-dir {TINY_DIR}/data", timeout=300)
    return time.monotonic() - t0


@pytest.fixture
def make_container(golden, request):
    made: list[Container] = []

    def make(vmid: int = 200, start: bool = True, trainer: bool = False) -> Container:
        c = _prepare_clone(golden, vmid, start)
        made.append(c)
        if trainer:
            wheel = request.getfixturevalue("trainer_wheel")
            c.timings["trainer_install"] = install_trainer(c, wheel)
            c.timings["make_tiny"] = make_tiny(c)
        return c

    yield make
    for c in made:
        lxc.stop(c.name, kill=True)
        lxc.destroy(c.name)
        assert not lxc.exists(c.name), f"container {c.name} survived lxc-destroy"


@pytest.fixture
def ct200(make_container) -> Container:
    return make_container(200)


def start_pve_api(state_dir: Path, *args: str) -> dict:
    """`python -m harness.pve_api start <state_dir> [args]`; returns its pve_api.json as a dict."""
    p = subprocess.run([sys.executable, "-m", "harness.pve_api", "start", str(state_dir), *args], cwd=HARNESS_DIR.parent,
                       text=True, capture_output=True, timeout=400)
    if p.returncode != 0:
        raise RuntimeError(f"pve_api start failed ({p.returncode}): {p.stderr[-3000:]}")
    return json.loads((Path(state_dir) / "pve_api.json").read_text())


def stop_pve_api(state_dir: Path) -> dict:
    """Stop the stand-in by its pid and destroy every container it created."""
    p = subprocess.run([sys.executable, "-m", "harness.pve_api", "stop", str(state_dir)], cwd=HARNESS_DIR.parent,
                       text=True, capture_output=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"pve_api stop failed ({p.returncode}): {p.stderr[-3000:]}")
    return json.loads(p.stdout or "{}")


@pytest.fixture
def pve_api(containers_ok, tmp_path_factory) -> dict:
    """A Proxmox API stand-in on 127.0.0.1 (node pve1, VM 150 listed, PVE 8.2.4), real LXC containers behind it
    (vmids from 300; the session lock of 200/201 is not taken). Yields its pve_api.json; stops it and destroys every
    container it created, also when the test fails."""
    d = tmp_path_factory.mktemp("pve_api")
    info = start_pve_api(d, "--vm", "150")
    try:
        yield info
    finally:
        stop_pve_api(d)


@pytest.fixture(scope="session")
def sshd(containers_ok, tmp_path_factory):
    s = Sshd(tmp_path_factory.mktemp("sshd")).start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def harness_env(sshd) -> dict:
    env = dict(os.environ)
    env.update(sshd.env())
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["ANSIBLE_COLLECTIONS_PATH"] = str(REPO_ROOT / ".collections")
    env["ANSIBLE_CONFIG"] = str(REPO_ROOT / "ansible.cfg")
    env["ANSIBLE_HOST_KEY_CHECKING"] = "False"
    env["ANSIBLE_PIPELINING"] = "False"
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_RETRY_FILES_ENABLED"] = "False"
    return env


@dataclass
class PlayResult:
    rc: int
    status: str
    stdout: str
    results: dict  # task name -> list of (host, ok|failed|skipped|unreachable, res)
    seconds: float
    plays: list = field(default_factory=list)  # (play name, wall seconds) in order, from the events' timestamps

    def task(self, name: str, host: str | None = None) -> dict:
        rows = [r for r in self.results.get(name, []) if host is None or r[0] == host]
        assert rows, f"task {name!r} produced no result; tasks: {list(self.results)}\n{self.stdout[-3000:]}"
        return rows[-1][2]

    def outcome(self, name: str, host: str | None = None) -> str:
        rows = [r for r in self.results.get(name, []) if host is None or r[0] == host]
        assert rows, f"task {name!r} produced no result\n{self.stdout[-3000:]}"
        return rows[-1][1]


def run_playbook(env: dict, playbook: Path | str, extravars: dict | None = None, inventory: Path | str = None,
                 limit: str | None = None, timeout: int = 600, cmdline: str = "") -> PlayResult:
    """ansible-playbook through ansible-runner (events give us each task's result)."""
    import ansible_runner

    inventory = str(inventory or HARNESS_INVENTORY)
    pdd = tempfile.mkdtemp(prefix="dflash-runner-")
    t0 = time.monotonic()
    try:
        r = ansible_runner.run(private_data_dir=pdd, playbook=str(playbook), inventory=inventory,
                               extravars=extravars or {}, envvars={k: v for k, v in env.items()
                                                                    if k.startswith(("ANSIBLE_", "DFLASH_"))},
                               limit=limit, quiet=True, timeout=timeout, project_dir=str(REPO_ROOT),
                               cmdline=cmdline or None)
        results: dict = {}
        marks = []  # (play name or None for the end, event time)
        for ev in r.events:
            kind = ev.get("event", "")
            d = ev.get("event_data", {})
            if kind in ("playbook_on_play_start", "playbook_on_stats") and ev.get("created"):
                marks.append((d.get("play") if kind == "playbook_on_play_start" else None,
                              datetime.fromisoformat(ev["created"])))
            if kind in ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable"):
                outcome = {"runner_on_ok": "ok", "runner_on_failed": "failed", "runner_on_skipped": "skipped",
                           "runner_on_unreachable": "unreachable"}[kind]
                results.setdefault(d.get("task"), []).append((d.get("host"), outcome, d.get("res", {})))
        stdout = r.stdout.read() if r.stdout else ""
        plays = [(name, (t1 - t).total_seconds()) for (name, t), (_, t1) in zip(marks, marks[1:]) if name]
        return PlayResult(r.rc, r.status, stdout, results, time.monotonic() - t0, plays)
    finally:
        shutil.rmtree(pdd, ignore_errors=True)


@pytest.fixture
def play(harness_env):
    os.environ.setdefault("PATH", "")
    if str(VENV_BIN) not in os.environ["PATH"].split(":"):
        os.environ["PATH"] = f"{VENV_BIN}:{os.environ['PATH']}"  # ansible-runner looks up ansible-playbook

    def _play(playbook, extravars=None, **kw) -> PlayResult:
        return run_playbook(harness_env, playbook, extravars, **kw)

    return _play
