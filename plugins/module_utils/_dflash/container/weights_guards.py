# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What must hold before weights are staged: room on the destination's file system and in the container's memory
cgroup (tmpfs pages count against it), and no live run reading the weights about to be replaced. INSIDE the
container; stdlib only."""

import os

from .run_status import live_run

CGROUP_ROOT = "/sys/fs/cgroup"
GB = 1e9


class RefusedError(Exception):
    def __init__(self, msg, **facts):
        Exception.__init__(self, msg)
        self.facts = facts


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cgroup_dirs():
    """This process's cgroup v2 directory and its ancestors, innermost first."""
    text = _read("/proc/self/cgroup") or ""
    rel = next((line[3:].strip() for line in text.splitlines() if line.startswith("0::")), "/")
    d = os.path.normpath(os.path.join(CGROUP_ROOT, rel.lstrip("/")))
    out = []
    while d.startswith(CGROUP_ROOT):
        out.append(d)
        if d == CGROUP_ROOT:
            break
        d = os.path.dirname(d)
    if CGROUP_ROOT not in out:
        out.append(CGROUP_ROOT)  # inside a cgroup namespace /proc/self/cgroup may name a path we cannot see
    return out


def memory_room():
    """(limit, available) bytes of the tightest memory cgroup, or (None, None) without a limit.

    available = memory.max - memory.current + reclaimable page cache (memory.stat: file - shmem): reading the
    model store fills the page cache, which the kernel drops for tmpfs pages; shmem (tmpfs) is not reclaimable.
    """
    best = (None, None)
    for d in _cgroup_dirs():
        raw_max = (_read(os.path.join(d, "memory.max")) or "").strip()
        raw_cur = (_read(os.path.join(d, "memory.current")) or "").strip()
        if not raw_max.isdigit() or not raw_cur.isdigit():
            continue
        stat = dict((k, int(v)) for k, v in (line.split() for line in
                                             (_read(os.path.join(d, "memory.stat")) or "").splitlines()
                                             if len(line.split()) == 2 and line.split()[1].isdigit()))
        reclaimable = max(0, stat.get("file", 0) - stat.get("shmem", 0))
        available = max(0, int(raw_max) - int(raw_cur) + reclaimable)
        if best[1] is None or available < best[1]:
            best = (int(raw_max), available)
    return best


def _amount(n):
    return "%d bytes (%.2f GB)" % (n, n / GB)


def check_room(needed, dest_parent):
    """Refuse when `needed` bytes of new files do not fit, naming the numbers and what to change."""
    free = free_bytes(dest_parent)
    limit, available = memory_room()
    facts = {"needed_bytes": needed, "free_bytes": free, "memory_limit_bytes": limit,
             "memory_available_bytes": available}
    if needed <= free and (available is None or needed <= available):
        return facts
    parts = ["%s has %s free" % (dest_parent, _amount(free))]
    if available is not None:
        parts.append("the container's memory limit of %s leaves %s" % (_amount(limit), _amount(available)))
    fixes = []
    if needed > free:
        fixes.append("enlarge that tmpfs (lxc.mount.entry ... size=..., or mount -o remount,size=... %s) or free "
                     "space there" % dest_parent)
    if available is not None and needed > available:
        fixes.append("raise the container's memory (pct set <vmid> --memory <MiB>) or free memory in it")
    fix = "; ".join(fixes)
    raise RefusedError("not enough room to stage %s: %s; %s" % (_amount(needed), ", ".join(parts), fix), **facts)


def _target_models(argv):
    """Values of --target-model in an argv (--target-model=X or --target-model X)."""
    out = []
    for i, arg in enumerate(argv or []):
        if arg.startswith("--target-model="):
            out.append(arg.split("=", 1)[1])
        elif arg == "--target-model" and i + 1 < len(argv):
            out.append(argv[i + 1])
    return out


def live_users(dest, runs_root):
    """[(run, pid)] of live runs under runs_root whose --target-model is dest (or where dest points)."""
    names = {os.path.normpath(dest), os.path.realpath(dest)}
    try:
        runs = sorted(os.listdir(runs_root))
    except OSError:
        return []
    found = []
    for run in runs:
        pid, launch = live_run(os.path.join(runs_root, run))
        if pid and any(os.path.normpath(t) in names or os.path.realpath(t) in names
                       for t in _target_models((launch or {}).get("argv"))):
            found.append((run, pid))
    return found


def check_users(dest, runs_root, force):
    users = live_users(dest, runs_root)
    if users and not force:
        raise RefusedError("%s is the target model of live run%s %s; stop %s first (stop_training.yml), or set "
                           "force=true to replace the weights under it"
                           % (dest, "s" if len(users) > 1 else "",
                              ", ".join("%s (pid %d)" % u for u in users), "them" if len(users) > 1 else "it"),
                           live_runs=[u[0] for u in users])
    return [u[0] for u in users]
