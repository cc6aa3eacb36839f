# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Backend of the lxc_raw_config module (runs on the Proxmox host): the raw lines a training container needs,
ensured in <pve_dir>/lxc/<vmid>.conf under PVE's own config lock, written safely on pmxcfs; and the host's facts
the API call needs (which NVIDIA device nodes exist), read in the same call so that a no-op converge makes one round
trip to the host, not two.

Uses only module.params, module.check_mode and module._diff, so tests can pass a small stand-in.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox import gpu, memory, raw_lines

MEMORY_LINE = re.compile(r"^memory:\s*(\d+)\s*$")


def argument_spec():
    """lxc_raw_config's options: the only place their defaults are declared."""
    own = ArgumentSpec(argument_spec=dict(
        vmid=dict(type="int", required=True),
        pve_dir=dict(type="path", default="/etc/pve"),
        shm_size_gib=dict(type="int"),
        gpu_devices=dict(type="list", elements="str", default=[]),
        proc_devices=dict(type="path", default="/proc/devices"),
        lines=dict(type="list", elements="str", default=[]),
        lock_dir=dict(type="path", default="/run/lock/lxc"),
        gpus=dict(type="list", elements="int", default=[]),
        dev_dir=dict(type="path", default="/dev"),
        absent_ok=dict(type="bool", default=False),
    ), mutually_exclusive=[("shm_size_gib", "weights_gib")])
    return own.merge(memory.sizing_argument_spec())


def host_devices(dev_dir):
    """The NVIDIA device nodes under dev_dir (and its nvidia-caps/), named as PVE knows them: /dev/<name>."""
    found = []
    for sub in ("", "nvidia-caps"):
        try:
            names = os.listdir(os.path.join(dev_dir, sub))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                continue
            raise
        found += ["/dev/" + (sub + "/" if sub else "") + n for n in names if n.startswith("nvidia")
                  and not os.path.isdir(os.path.join(dev_dir, sub, n))]
    return sorted(found)


def shm_size(p):
    """/dev/shm's size in GiB: shm_size_gib as given, or sized from weights_gib (as proxmox_lxc sizes it); None
    leaves the line alone."""
    if p["shm_size_gib"] is not None:
        if p["shm_size_gib"] < 1:
            raise ValueError("shm_size_gib must be at least 1 (GiB), got %d: leave it unset to keep /dev/shm as is"
                             % p["shm_size_gib"])
        return p["shm_size_gib"]
    return memory.shm_size_gib(p["weights_gib"], p["shm_margin"]) or None


def check_memory(p, shm_gib, conf_text):
    """The container's memory (as given, else its config's) must hold /dev/shm plus the trainer, before any line
    that sizes /dev/shm is written. conf_text None: no config yet (proxmox_lxc checks the memory it creates with)."""
    if not shm_gib or (conf_text is None and p["memory"] is None):
        return
    mem = p["memory"]
    if mem is None:
        found = [int(m.group(1)) for m in (MEMORY_LINE.match(line) for line in raw_lines.split_main(conf_text)[0]) if m]
        mem = found[-1] if found else memory.DEFAULT_MEMORY
    memory.check_memory(mem, shm_gib, p["trainer_memory_gib"])


def wanted_lines(p, proc_devices_text, shm_gib=None):
    """(the raw lines wanted, stale(key, value) or None) from the module's params and the host's /proc/devices."""
    wanted, stale = [], None
    if shm_gib:
        wanted.append(gpu.shm_line(shm_gib))
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
        devices = host_devices(p["dev_dir"]) if p["gpus"] else []
        gpu.gpu_device_paths(p["gpus"], devices)  # the GPUs asked for exist on this host
        shm_gib = shm_size(p)
        wanted, stale = wanted_lines(p, proc_text, shm_gib)
        raw_lines.ensure("", wanted)  # validates every line before anything is read or locked
        exists = os.path.exists(path)
        check_memory(p, shm_gib, read_text(path) if exists else None)
    except ValueError as exc:
        raise ModuleFailure(str(exc))
    result = dict(changed=False, path=path, lines=[raw_lines.normalize(line) for line in wanted], added=[],
                  removed=[], exists=exists, host_devices=devices, shm_size_gib=shm_gib or 0)
    if not exists and p["absent_ok"]:
        result["msg"] = "%s does not exist yet: nothing to do until the container is created" % path
        return result
    if not exists:
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
