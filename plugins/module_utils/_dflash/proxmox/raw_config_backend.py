# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Backend of the lxc_raw_config module (runs on the Proxmox host): the raw lines a training container needs,
ensured in <pve_dir>/lxc/<vmid>.conf under PVE's own config lock, written safely on pmxcfs.

Uses only module.params, module.check_mode and module._diff, so tests can pass a small stand-in.
"""

from __future__ import annotations

import errno
import fcntl
import os

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox import gpu, raw_lines


def argument_spec():
    """lxc_raw_config's options: the only place their defaults are declared."""
    return ArgumentSpec(argument_spec=dict(
        vmid=dict(type="int", required=True),
        pve_dir=dict(type="path", default="/etc/pve"),
        shm_size_gib=dict(type="int"),
        gpu_devices=dict(type="list", elements="str", default=[]),
        proc_devices=dict(type="path", default="/proc/devices"),
        lines=dict(type="list", elements="str", default=[]),
        lock_dir=dict(type="path", default="/run/lock/lxc"),
    ))


def wanted_lines(p, proc_devices_text):
    """(the raw lines wanted, stale(key, value) or None) from the module's params and the host's /proc/devices."""
    wanted, stale = [], None
    if p["shm_size_gib"] is not None:
        if p["shm_size_gib"] < 1:
            raise ValueError("shm_size_gib must be at least 1 (GiB), got %d: leave it unset to keep /dev/shm as is"
                             % p["shm_size_gib"])
        wanted.append(gpu.shm_line(p["shm_size_gib"]))
    if p["gpu_devices"]:
        bad = [d for d in p["gpu_devices"] if not d.startswith("/dev/nvidia")]
        if bad:
            raise ValueError("gpu_devices must be NVIDIA device nodes under /dev, got %s" % ", ".join(bad))
        majors = gpu.parse_proc_devices(proc_devices_text)
        wanted += gpu.raw_gpu_lines(p["gpu_devices"], majors)
        stale = raw_lines.stale_whole_major(majors.values())
    wanted += p["lines"]
    return wanted, stale


def read_text(path):
    with open(path) as f:
        return f.read()


def write_safely(path, text):
    """PVE's own way first (PVE::Tools::file_set_contents: <file>.tmp.<pid> in the same directory, then rename);
    where pmxcfs refuses that (EPERM/EACCES/ENOTSUP/EXDEV/EINVAL), rewrite the file in place with one write of the
    whole content, still under PVE's config lock. Returns the method used."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        try:
            os.write(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        return "rename"
    except OSError as exc:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if exc.errno not in (errno.EPERM, errno.EACCES, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOSYS):
            raise
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        data = text.encode("utf-8")
        if os.write(fd, data) != len(data):
            raise OSError(errno.EIO, "short write to %s" % path)
    finally:
        os.close(fd)
    return "in-place"


class ConfigLock(object):
    """PVE's per-container config lock (/run/lock/lxc/pve-config-<vmid>.lock, the one pct set takes)."""

    def __init__(self, lock_dir, vmid):
        self.path = os.path.join(lock_dir, "pve-config-%d.lock" % vmid)
        self.fd = None

    def __enter__(self):
        if not os.path.isdir(os.path.dirname(self.path)):
            os.makedirs(os.path.dirname(self.path), 0o755)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def ensure_raw_config(module):
    p = module.params
    path = os.path.join(p["pve_dir"], "lxc", "%d.conf" % p["vmid"])
    try:
        proc_text = read_text(p["proc_devices"]) if p["gpu_devices"] else ""
    except OSError as exc:
        raise ModuleFailure("cannot read %s (%s): run lxc_raw_config on the Proxmox host, or set proc_devices"
                            % (p["proc_devices"], exc.strerror))
    try:
        wanted, stale = wanted_lines(p, proc_text)
        raw_lines.ensure("", wanted)  # validates every line before anything is read or locked
    except ValueError as exc:
        raise ModuleFailure(str(exc))
    result = dict(changed=False, path=path, lines=[raw_lines.normalize(line) for line in wanted], added=[],
                  removed=[])
    if not os.path.exists(path):
        if module.check_mode:  # the container is created by an earlier task that check mode did not run
            result.update(changed=True, added=result["lines"], msg="%s does not exist yet" % path)
            return with_diff(module, result, "", text_of(result["lines"]))
        raise ModuleFailure("CT %d has no config file %s: create the container first (dflash.ops.proxmox_lxc "
                            "state=present), or set pve_dir" % (p["vmid"], path))
    if module.check_mode:
        return apply(module, result, path, wanted, stale)
    with ConfigLock(p["lock_dir"], p["vmid"]):
        return apply(module, result, path, wanted, stale)


def apply(module, result, path, wanted, stale):
    before = read_text(path)
    after, added, removed = raw_lines.ensure(before, wanted, stale)
    result.update(added=added, removed=removed, changed=after != before)
    if result["changed"] and not module.check_mode:
        result["write"] = write_safely(path, after)
    return with_diff(module, result, before, after)


def with_diff(module, result, before, after):
    if getattr(module, "_diff", False):
        header = result["path"] + " (raw lxc lines)"
        result["diff"] = dict(before=text_of(raw_lines.raw_lines(before)), after=text_of(raw_lines.raw_lines(after)),
                              before_header=header, after_header=header)
    return result


def text_of(lines):
    return "".join(line + "\n" for line in lines)
