"""The API methods of docs/proxmox.md's subset, over the PVE files and the real LXC containers (backend)."""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field

from . import pveconf, schema
from .backend import Backend, machine_lock
from .schema import ApiError
from .tasks import TaskError, Tasks, parse_upid

# templates the stand-in knows: all are the harness's golden Debian container
TEMPLATES = {"local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst": "debian"}
# storage id -> content types (a default PVE install: local = dir, local-lvm = lvmthin)
STORAGES = {"local": {"vztmpl", "iso", "backup"}, "local-lvm": {"rootdir", "images"}}


@dataclass
class Context:
    node: str
    version: str
    backend: Backend
    tasks: Tasks
    vms: dict = field(default_factory=dict)  # vmid -> name (qemu guests that only exist in the list)
    next_id_lower: int = 100
    lock: threading.RLock = field(default_factory=threading.RLock)


def dispatch(ctx: Context, method: str, rel: str, params: dict, user: str):
    for m, pattern, fn in ROUTES:
        match = re.fullmatch(pattern, rel)
        if match and m == method:
            return fn(ctx, params, user, *match.groups())
    raise ApiError(501, f"Method '{method} {rel}' not implemented")


def need_node(ctx: Context, node: str) -> None:
    if node != ctx.node:
        raise ApiError(500, f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
                            f"Name or service not known")


def need_ct(ctx: Context, node: str, vmid_s: str) -> int:
    need_node(ctx, node)
    vmid = schema.vmid(vmid_s)
    if not ctx.backend.has_conf(vmid):
        raise ApiError(500, f"Configuration file '{ctx.backend.conf_rel(vmid)}' does not exist")
    return vmid


def check_lock(keys: dict) -> None:
    if keys.get("lock"):
        raise ApiError(500, f"CT is locked ({keys['lock']})")


def has_devn(ctx: Context) -> bool:
    """devN exists from pve-container 5.0.7 = PVE 8.1 on (docs/proxmox.md)."""
    nums = [int(x) for x in re.findall(r"\d+", ctx.version)[:2]]
    return tuple(nums) >= (8, 1)


def taken(ctx: Context, vmid: int) -> str | None:
    if vmid in ctx.vms:
        return f"VM {vmid} already exists on node '{ctx.node}'"
    if not ctx.backend.has_conf(vmid):
        ctx.backend.reclaim_orphan(vmid)
    if ctx.backend.has_conf(vmid) or ctx.backend.foreign(vmid):
        return f"CT {vmid} already exists on node '{ctx.node}'"
    return None


# --- cluster, nodes, access ------------------------------------------------------------------------------------
def get_version(ctx, params, user):
    return {"version": ctx.version, "release": ".".join(ctx.version.split(".")[:2]), "repoid": "ec58e45e1bcdf2ac"}


def get_nodes(ctx, params, user):
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return [{"node": ctx.node, "status": "online", "type": "node", "id": f"node/{ctx.node}", "level": "",
             "maxcpu": os.cpu_count(), "maxmem": mem, "cpu": 0.0, "mem": 0, "uptime": 0}]


def get_nextid(ctx, params, user):
    if "vmid" in params:
        vmid = schema.vmid(params["vmid"])
        if taken(ctx, vmid):
            raise schema.param_error({"vmid": f"VM {vmid} already exists"})
        return str(vmid)
    for vmid in range(ctx.next_id_lower, 1000000):
        if not taken(ctx, vmid):
            return str(vmid)  # PVE answers nextid as a string
    raise ApiError(500, "unable to get any free VMID in range")


# --- containers ------------------------------------------------------------------------------------------------
def ct_summary(ctx: Context, vmid: int) -> dict:
    b = ctx.backend
    keys, _raw, _d = b.read(vmid)
    running = b.running(vmid)
    memory = int(keys.get("memory", 512))
    d = {"vmid": vmid, "name": keys.get("hostname", f"CT{vmid}"), "status": "running" if running else "stopped",
         "type": "lxc", "maxmem": memory * pveconf.MIB, "mem": b.mem_used(vmid) if running else 0,
         "maxswap": int(keys.get("swap", 512)) * pveconf.MIB, "swap": 0, "cpus": int(keys.get("cores", os.cpu_count())),
         "cpu": 0, "uptime": b.uptime(vmid) if running else 0, "maxdisk": rootfs_bytes(keys), "disk": 0,
         "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0}
    if keys.get("lock"):
        d["lock"] = keys["lock"]
    if running:
        d["pid"] = b.init_pid(vmid)
    return d


def rootfs_bytes(keys: dict) -> int:
    m = re.search(r"size=(\d+)G", keys.get("rootfs", ""))
    return int(m.group(1)) * 1024 ** 3 if m else 0


def list_lxc(ctx, params, user, node):
    need_node(ctx, node)
    return [ct_summary(ctx, v) for v in ctx.backend.vmids()]


def list_qemu(ctx, params, user, node):
    need_node(ctx, node)
    return [{"vmid": v, "name": n, "status": "stopped", "maxmem": 2048 * pveconf.MIB, "mem": 0, "cpus": 1,
             "maxdisk": 32 * 1024 ** 3, "disk": 0, "uptime": 0, "netin": 0, "netout": 0, "diskread": 0,
             "diskwrite": 0, "cpu": 0} for v, n in sorted(ctx.vms.items())]


def ct_index(ctx, params, user, node, vmid_s):
    need_ct(ctx, node, vmid_s)
    return [{"subdir": s} for s in ("config", "status", "tasks")]


def _volume(ctx: Context, vmid: int, key: str, value: str, disk_no: int, default_storage: str) -> str:
    """`STORAGE:GiB[,opts]` → an allocated volume `STORAGE:vm-<vmid>-disk-N,…,size=NG` (PVE's create path)."""
    d = pveconf.property_string(value, "volume")
    vol = d.pop("volume")
    if re.fullmatch(r"\d+(\.\d+)?", vol):
        vol = f"{default_storage}:{vol}"
    m = re.fullmatch(r"([a-zA-Z][\w.-]*):(\d+(?:\.\d+)?)", vol)
    if not m:
        return value  # a bind mount (host path) or an existing volume: kept as given
    sid, size = m.group(1), m.group(2)
    if sid not in STORAGES:
        raise ApiError(500, f"storage '{sid}' does not exist")
    if "rootdir" not in STORAGES[sid]:
        raise schema.param_error({"storage": f"storage '{sid}' does not support container directories"})
    opts = "".join(f",{k}={v}" for k, v in d.items())
    return f"{sid}:vm-{vmid}-disk-{disk_no}{opts},size={size.rstrip('0').rstrip('.') if '.' in size else size}G"


def check_devices(ctx: Context, new: dict) -> None:
    for k, v in new.items():
        if schema.indexed(k) == "dev":
            path = pveconf.property_string(v, "path")["path"]
            host = pveconf.device_path(str(ctx.backend.dev_root), path)
            if not host.exists():
                raise ApiError(500, f"Device {path} does not exist")
            if not (host.is_char_device() or host.is_block_device()):
                raise ApiError(500, f"{path} is not a device")


def create_lxc(ctx, params, user, node):
    need_node(ctx, node)
    p = schema.verify(params, create=True, devices=has_devn(ctx))
    vmid = int(p.pop("vmid"))
    unprivileged = p.get("unprivileged", "1") == "1"
    with ctx.lock, machine_lock():
        why = taken(ctx, vmid)
        if why:
            raise ApiError(500, why)
        template = p.pop("ostemplate")
        storage = p.pop("storage", "local")
        start = p.pop("start", "0") == "1"
        for k in ("password", "ssh-public-keys", "pool", "force", "unique", "ignore-unpack-errors", "restore"):
            p.pop(k, None)
        schema.check_modify_perm(user, p, [], None, unprivileged)
        sid = template.split(":", 1)[0]
        if ":" in template and sid not in STORAGES:
            raise ApiError(500, f"storage '{sid}' does not exist")
        if template not in TEMPLATES:
            raise ApiError(500, f"volume '{template}' does not exist")
        has_mp = any(schema.indexed(k) == "mp" for k in p)
        if has_mp and "rootfs" not in p:
            raise ApiError(500, "mount points configured, but 'rootfs' not set - aborting")
        p["rootfs"] = _volume(ctx, vmid, "rootfs", p.get("rootfs", f"{storage}:4"), 0, storage)
        disk_no = 1
        for k in sorted((k for k in p if schema.indexed(k) == "mp"), key=lambda x: int(x[2:])):
            p[k] = _volume(ctx, vmid, k, p[k], disk_no, storage)
            disk_no += 1
        check_devices(ctx, p)
        keys = {"arch": "amd64", "ostype": TEMPLATES[template], "hostname": f"CT{vmid}", "memory": "512",
                "swap": "512", **p}
        if unprivileged:
            keys["unprivileged"] = "1"
        else:
            keys.pop("unprivileged", None)
        ctx.backend.write(vmid, {**keys, "lock": "create"}, [])

    def work():
        try:
            ctx.backend.clone(vmid)
        except Exception:
            ctx.backend.conf_path(vmid).unlink(missing_ok=True)
            raise
        with ctx.lock:
            k, raw, _ = ctx.backend.read(vmid)
            k.pop("lock", None)
            ctx.backend.write(vmid, k, raw)
        if start:
            ctx.backend.start(vmid)

    return ctx.tasks.run("vzcreate", str(vmid), user, work).upid


def get_config(ctx, params, user, node, vmid_s):
    vmid = need_ct(ctx, node, vmid_s)
    keys, raw, digest = ctx.backend.read(vmid)
    out: dict = {}
    for k, v in keys.items():
        if k in schema.INT_KEYS or k in schema.BOOL_KEYS:
            out[k] = int(v) if re.fullmatch(r"-?\d+", v) else v
        else:
            out[k] = v
    out["digest"] = digest
    if raw:
        out["lxc"] = [[k, v] for k, v in raw]
    return out


def put_config(ctx, params, user, node, vmid_s):
    vmid = need_ct(ctx, node, vmid_s)
    p = schema.verify(params, create=False, devices=has_devn(ctx))
    want_digest = p.pop("digest", None)
    delete = [d for d in re.split(r"[,;\s]+", p.pop("delete", "")) if d]
    p.pop("revert", None)
    with ctx.lock:
        keys, raw, digest = ctx.backend.read(vmid)
        schema.check_modify_perm(user, p, delete, keys, keys.get("unprivileged") == "1")
        check_lock(keys)
        if want_digest is not None and want_digest != digest:
            raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
        for k in delete:
            if k in p:
                raise schema.param_error({k: "unable to delete parameter that is being set"})
        check_devices(ctx, p)
        for k in delete:
            keys.pop(k, None)
        keys.update(p)
        ctx.backend.write(vmid, keys, raw)
        if "memory" in p and ctx.backend.running(vmid):
            ctx.backend.set_memory_live(vmid, int(p["memory"]))
    return None


def status_current(ctx, params, user, node, vmid_s):
    vmid = need_ct(ctx, node, vmid_s)
    return ct_summary(ctx, vmid)


def status_action(ctx, params, user, node, vmid_s, action):
    vmid = need_ct(ctx, node, vmid_s)
    keys, _raw, _d = ctx.backend.read(vmid)
    b = ctx.backend
    if action == "start":
        check_lock(keys)
        if b.running(vmid):
            raise ApiError(500, f"CT {vmid} already running")
        return ctx.tasks.run("vzstart", str(vmid), user, lambda: b.start(vmid)).upid
    if not b.running(vmid):
        raise ApiError(500, f"CT {vmid} not running")
    if action == "stop":
        check_lock(keys)  # PVE: skiplock is root-only and off by default
        return ctx.tasks.run("vzstop", str(vmid), user, lambda: b.stop(vmid)).upid
    timeout, err = schema.check_int(params.get("timeout", 60), 0, None)
    force, err2 = schema.check_bool(params.get("forceStop", 0))
    if err or err2:
        raise schema.param_error({k: e for k, e in (("timeout", err), ("forceStop", err2)) if e})
    check_lock(keys)
    return ctx.tasks.run("vzshutdown", str(vmid), user, lambda: b.shutdown(vmid, timeout, bool(force))).upid


def destroy(ctx, params, user, node, vmid_s):
    vmid = need_ct(ctx, node, vmid_s)
    keys, _raw, _d = ctx.backend.read(vmid)
    check_lock(keys)
    if ctx.backend.running(vmid):
        raise ApiError(500, f"unable to destroy CT {vmid} - container is running")

    def work():
        if ctx.backend.running(vmid):
            raise TaskError(f"unable to destroy CT {vmid} - container is running")
        ctx.backend.destroy(vmid)

    return ctx.tasks.run("vzdestroy", str(vmid), user, work).upid


def task_status(ctx, params, user, node, upid):
    need_node(ctx, node)
    if parse_upid(upid) is None:
        raise schema.param_error({"upid": "unable to parse worker upid"})
    task = ctx.tasks.get(upid)
    if task is None:
        raise ApiError(500, f"no such task '{upid}'")
    return task.as_status()


_CT = r"/nodes/([^/]+)/lxc/([^/]+)"
ROUTES = [
    ("GET", r"/version", get_version),
    ("GET", r"/nodes", get_nodes),
    ("GET", r"/cluster/nextid", get_nextid),
    ("GET", r"/nodes/([^/]+)/lxc", list_lxc),
    ("POST", r"/nodes/([^/]+)/lxc", create_lxc),
    ("GET", r"/nodes/([^/]+)/qemu", list_qemu),
    ("GET", _CT, ct_index),
    ("DELETE", _CT, destroy),
    ("GET", _CT + r"/config", get_config),
    ("PUT", _CT + r"/config", put_config),
    ("GET", _CT + r"/status/current", status_current),
    ("POST", _CT + r"/status/(start|stop|shutdown)", status_action),
    ("GET", r"/nodes/([^/]+)/tasks/([^/]+)/status", task_status),
]
