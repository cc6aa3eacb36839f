# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Process facts read from /proc, and stopping a process group for good.

Stdlib only: part of the package shipped into the container (see controller/lifecycle_shipping.py).
"""

import os
import signal
import time

POLL_S = 0.05


def _stat_fields(pid):
    """Fields of /proc/<pid>/stat after the command name, or None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    # comm may hold spaces and parentheses: the fields follow the last ')'.
    return data[data.rfind(")") + 2:].split(" ")


def proc_state(pid):
    """One-letter state of pid ('R', 'S', 'Z', …) or None when there is no such process."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def proc_pgrp(pid):
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def is_alive(pid):
    """True for a running process; a zombie is dead (our init may never reap it)."""
    state = proc_state(pid)
    return state is not None and state not in ("Z", "X")


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else []


def environ(pid):
    """{name: value} of pid's environment as it was started, or None when it cannot be read (gone, not ours)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0") if item)
    return dict((name, value) for name, _eq, value in pairs)


def cmdline_matches(actual, launched):
    """Does a /proc cmdline belong to the argv we launched?

    A script started through its shebang shows up as [interpreter, script, args…], so the launched
    arguments must be the tail and the launched program must appear (by name) before them.
    """
    if not actual or not launched:
        return False
    args = launched[1:]
    if args and actual[-len(args):] != args:
        return False
    head = actual[:len(actual) - len(args)]
    prog = os.path.basename(launched[0])
    return any(os.path.basename(h) == prog for h in head)


def all_pids():
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def group_members(pgid):
    return [pid for pid in all_pids() if proc_pgrp(pid) == pgid and is_alive(pid)]


def holders_of(paths):
    """pids (not ours) with an open file descriptor on any of paths, e.g. /dev/nvidia5."""
    wanted = set(os.path.realpath(p) for p in paths)
    found = {}
    me = os.getpid()
    for pid in all_pids():
        if pid == me:
            continue
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in wanted and is_alive(pid):
                found.setdefault(pid, set()).add(target)
    return dict((pid, sorted(paths)) for pid, paths in found.items())


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def stop_group(pgid, grace_s):
    """SIGTERM the group, wait up to grace_s, then SIGKILL; return once every member is gone.

    Returns {"pgid", "signal": "SIGTERM"|"SIGKILL", "waited_s"}.
    """
    start = time.monotonic()
    _signal_group(pgid, signal.SIGTERM)
    used = "SIGTERM"
    while group_members(pgid):
        if time.monotonic() - start >= grace_s:
            _signal_group(pgid, signal.SIGKILL)
            used = "SIGKILL"
            break
        time.sleep(POLL_S)
    deadline = time.monotonic() + 30
    while group_members(pgid):
        if time.monotonic() > deadline:
            raise RuntimeError("process group %d survived SIGKILL for 30 s (stuck in the kernel?)" % pgid)
        time.sleep(POLL_S)
    return {"pgid": pgid, "signal": used, "waited_s": round(time.monotonic() - start, 3)}
