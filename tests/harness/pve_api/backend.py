"""The real side of the API stand-in: LXC containers cloned from the harness's golden container.

A CT created through the API is the LXC container `<vmid>` (snapshot clone of the golden), with
`/var/lib/lxc/<vmid>/config.base` (lxc-copy's config) and `pve_api.json` (where its PVE file is). Its LXC config
is rendered from the PVE file at every start (pveconf.render_container), so PUT, `pct set` and raw lines edited in
the file take effect at the next start, as on PVE.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from .. import LOCK_DIR, lxc
from . import pveconf
from .tasks import TaskError


@contextmanager
def machine_lock():
    """One lock for every stand-in server on this machine: a vmid check and the clone that takes it are atomic."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / "pve_api.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Backend:
    def __init__(self, pve_dir: Path, node: str, dev_root: Path, golden: str):
        self.pve_dir = Path(pve_dir)
        self.node = node
        self.dev_root = Path(dev_root)
        self.golden = golden
        self.conf_dir = self.pve_dir / "nodes" / node / "lxc"
        self.images = self.pve_dir / "images"

    # --- the PVE file ------------------------------------------------------------------------------------------
    def conf_path(self, vmid: int) -> Path:
        return self.conf_dir / f"{vmid}.conf"

    def conf_rel(self, vmid: int) -> str:
        return f"nodes/{self.node}/lxc/{vmid}.conf"

    def has_conf(self, vmid: int) -> bool:
        return self.conf_path(vmid).exists()

    def read(self, vmid: int) -> tuple[dict, list, str]:
        raw_bytes = self.conf_path(vmid).read_bytes()
        keys, raw = pveconf.parse(raw_bytes.decode())
        return keys, raw, pveconf.digest(raw_bytes)

    def write(self, vmid: int, keys: dict, raw: list) -> None:
        pveconf.write_atomic(self.conf_path(vmid), pveconf.format_conf(keys, raw))

    def vmids(self) -> list[int]:
        return sorted(int(p.stem) for p in self.conf_dir.glob("*.conf") if p.stem.isdigit())

    def foreign(self, vmid: int) -> bool:
        """An LXC container of this name exists that this server did not create (another harness test's)."""
        d = lxc.LXC_PATH / str(vmid)
        if not d.exists():
            return False
        try:
            return json.loads((d / pveconf.MARKER).read_text())["conf"] != str(self.conf_path(vmid))
        except (OSError, ValueError, KeyError):
            return True

    def reclaim_orphan(self, vmid: int) -> bool:
        """Destroy CT `vmid` when a stand-in server that is gone (killed run, machine restart) left it behind, so a
        later run's create of the same vmid is not refused; a live server's container or one without our marker is
        never touched. True when one was destroyed."""
        d = lxc.LXC_PATH / str(vmid)
        try:
            meta = json.loads((d / pveconf.MARKER).read_text())
        except (OSError, ValueError):
            return False
        owner = meta.get("owner")
        if not isinstance(owner, dict) or process_start(owner.get("pid")) == owner.get("start"):
            return False
        lxc.run("lxc-stop", "-n", str(vmid), "--kill", check=False, timeout=60)
        lxc.run("lxc-destroy", "-f", "-n", str(vmid), check=False, timeout=300)
        if meta.get("images"):
            shutil.rmtree(meta["images"], ignore_errors=True)
        return not d.exists()

    # --- LXC ---------------------------------------------------------------------------------------------------
    def clone(self, vmid: int) -> None:
        name = str(vmid)
        if (lxc.LXC_PATH / name).exists():
            raise TaskError(f"unable to create CT {vmid} - LXC container '{name}' already exists on this machine")
        lxc.run("lxc-copy", "-n", self.golden, "-N", name, "-s", "-B", "overlayfs", timeout=300)
        d = lxc.LXC_PATH / name
        shutil.copy2(d / "config", d / "config.base")
        owner = {"pid": os.getpid(), "start": process_start(os.getpid())}  # the server; reclaim_orphan reads it
        (d / pveconf.MARKER).write_text(json.dumps({"conf": str(self.conf_path(vmid)), "dev_root": str(self.dev_root),
                                                    "images": str(self.images / name), "owner": owner}))

    def state(self, vmid: int) -> str:
        st = lxc.state(str(vmid))
        return {"RUNNING": "running", "STOPPED": "stopped"}.get(st, "stopped" if st == "MISSING" else "unknown")

    def running(self, vmid: int) -> bool:
        return lxc.state(str(vmid)) == "RUNNING"

    def start(self, vmid: int) -> None:
        try:
            pveconf.render_container(str(vmid))
        except ValueError as e:
            raise TaskError(str(e)) from None
        p = lxc.run("lxc-start", "-n", str(vmid), check=False, timeout=60)
        if p.returncode != 0:
            raise TaskError(f"startup for container '{vmid}' failed")
        w = lxc.run("lxc-wait", "-n", str(vmid), "-s", "RUNNING", "-t", "30", check=False, timeout=40)
        if w.returncode != 0:
            raise TaskError(f"startup for container '{vmid}' failed")

    def stop(self, vmid: int) -> None:
        p = lxc.run("lxc-stop", "-n", str(vmid), "--kill", check=False, timeout=60)
        if p.returncode != 0 and self.running(vmid):
            raise TaskError(f"stopping container '{vmid}' failed")

    def shutdown(self, vmid: int, timeout: int, force: bool) -> None:
        lxc.run("lxc-stop", "-n", str(vmid), "-t", str(timeout), check=False, timeout=timeout + 30)
        if self.running(vmid):
            if not force:
                raise TaskError(f"shutdown of container '{vmid}' failed - got timeout")
            self.stop(vmid)

    def destroy(self, vmid: int) -> None:
        d = lxc.LXC_PATH / str(vmid)
        if d.exists() and not self.foreign(vmid):  # another server may hold the vmid now (reclaim_orphan)
            if self.running(vmid):
                lxc.run("lxc-stop", "-n", str(vmid), "--kill", check=False)
            lxc.run("lxc-destroy", "-f", "-n", str(vmid), check=False, timeout=300)
        shutil.rmtree(self.images / str(vmid), ignore_errors=True)
        self.conf_path(vmid).unlink(missing_ok=True)

    # --- live numbers ------------------------------------------------------------------------------------------
    def cgroup_file(self, vmid: int, v1: str, v2: str) -> Path:
        if pveconf.CGROUP_V1:
            return Path(f"/sys/fs/cgroup/memory/lxc.payload.{vmid}/{v1}")
        return Path(f"/sys/fs/cgroup/lxc.payload.{vmid}/{v2}")

    def mem_used(self, vmid: int) -> int:
        try:
            return int(self.cgroup_file(vmid, "memory.usage_in_bytes", "memory.current").read_text())
        except (OSError, ValueError):
            return 0

    def set_memory_live(self, vmid: int, memory_mib: int) -> None:
        """PVE hot-plugs memory into a running CT's cgroup."""
        try:
            self.cgroup_file(vmid, "memory.limit_in_bytes", "memory.max").write_text(str(memory_mib * pveconf.MIB))
        except OSError:
            pass

    def uptime(self, vmid: int) -> int:
        pid = lxc.init_pid(str(vmid))
        if not pid:
            return 0
        start_ticks = process_start(pid)
        if start_ticks is None:
            return 0
        boot_up = float(Path("/proc/uptime").read_text().split()[0])
        return max(0, int(boot_up - start_ticks / os.sysconf("SC_CLK_TCK")))

    def init_pid(self, vmid: int) -> int | None:
        return lxc.init_pid(str(vmid))


def process_start(pid) -> int | None:
    """Start time (clock ticks since boot) of process `pid`: with the pid it names one process, never a reused pid."""
    try:
        return int(Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError, TypeError):
        return None


def make_stand_in_devices(dev_root: Path, gpus: int) -> list[str]:
    """Character devices standing in for the NVIDIA nodes, under a test-only directory (never the host's /dev).

    Numbers like a real host's: nvidia<N> 195:N, nvidiactl 195:255, nvidia-uvm / -tools on a 'dynamic' major
    (here 509), nvidia-caps/nvidia-cap1|2 on 235."""
    dev_root.mkdir(parents=True, exist_ok=True)
    nodes = {f"nvidia{i}": (195, i) for i in range(gpus)}
    nodes.update({"nvidiactl": (195, 255), "nvidia-uvm": (509, 0), "nvidia-uvm-tools": (509, 1),
                  "nvidia-caps/nvidia-cap1": (235, 1), "nvidia-caps/nvidia-cap2": (235, 2)})
    made = []
    for rel, (major, minor) in nodes.items():
        p = dev_root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists():
            os.mknod(p, 0o666 | 0o020000, os.makedev(major, minor))
            os.chmod(p, 0o666)
        made.append(f"/dev/{rel}")
    return made

