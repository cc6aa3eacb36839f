# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""GPU passthrough of a Proxmox container: which host device nodes, as devN entries (PVE >= 8.1) or as raw lxc
lines (older hosts). Pure functions; which nodes exist and /proc/devices are read by the caller, on the host."""

from __future__ import annotations

import re

# Always needed with any GPU; nvidia-uvm-tools and nvidia-caps/* are passed when the host has them.
CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm")
OPTIONAL = ("/dev/nvidia-uvm-tools",)
CAPS_DIR = "/dev/nvidia-caps/"
GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")
FIX_MISSING = ("load the driver on the host (nvidia-smi creates nvidia<N> and nvidiactl; nvidia-modprobe -u -c=0 "
               "creates nvidia-uvm) or fix gpus")


def gpu_device_paths(gpus, host_devices):
    """The host device nodes a container with GPUs `gpus` needs, in devN order: /dev/nvidia<N> per GPU (as given),
    nvidiactl, nvidia-uvm, then nvidia-uvm-tools and the nvidia-caps nodes the host has. [] without GPUs."""
    if not gpus:
        return []
    present = set(host_devices or [])
    if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        raise ValueError("gpus must be distinct indexes >= 0, got %s" % list(gpus))
    host_gpus = sorted(int(m.group(1)) for m in (GPU_NODE.match(p) for p in present) if m)
    wanted = ["/dev/nvidia%d" % g for g in gpus]
    missing = [p for p in wanted + list(CONTROL) if p not in present]
    if missing:
        raise ValueError("%s not on the host (it has GPUs %s): %s"
                         % (", ".join(missing), ",".join(str(g) for g in host_gpus) or "none", FIX_MISSING))
    caps = sorted(p for p in present if p.startswith(CAPS_DIR))
    return wanted + list(CONTROL) + [p for p in OPTIONAL if p in present] + caps


def parse_proc_devices(text):
    """/proc/devices → {name: major} of its character devices (the block section is ignored)."""
    majors = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if line.endswith(":"):
            section = line[:-1].lower()
            continue
        parts = line.split(None, 1)
        if section == "character devices" and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def _major_of(majors, names, what):
    for name in names:
        if name in majors:
            return majors[name]
    raise ValueError("%s has no character device major in /proc/devices (looked for %s): load the NVIDIA driver "
                     "on the host (nvidia-modprobe -u -c=0 for nvidia-uvm)" % (what, " or ".join(names)))


def needed_majors(paths, majors):
    """The majors the raw cgroup lines must allow for `paths`: the driver's frontend (195), nvidia-uvm's dynamic
    major (it changes between boots), and nvidia-caps' when a caps node is passed."""
    if not paths:
        return []
    found = {_major_of(majors, ("nvidia-frontend", "nvidia", "nvidiactl"), "the NVIDIA driver"),
             _major_of(majors, ("nvidia-uvm",), "nvidia-uvm")}
    if any(p.startswith(CAPS_DIR) for p in paths):
        found.add(_major_of(majors, ("nvidia-caps",), "nvidia-caps"))
    return sorted(found)


def raw_gpu_lines(paths, majors):
    """Raw lines for hosts without devN (PVE < 8.1): one cgroup allow per major, one bind mount per node."""
    lines = ["lxc.cgroup2.devices.allow: c %d:* rwm" % m for m in needed_majors(paths, majors)]
    lines += ["lxc.mount.entry: %s %s none bind,optional,create=file" % (p, p.lstrip("/")) for p in paths]
    return lines


def shm_line(size_gib):
    """The raw line that gives the container's /dev/shm a size (docs/proxmox.md): its pages count against `memory`."""
    return "lxc.mount.entry: tmpfs dev/shm tmpfs nodev,nosuid,size=%dg,mode=1777,create=dir 0 0" % size_gib
