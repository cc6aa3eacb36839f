#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: lxc_raw_config
short_description: Ensure the raw lxc lines of a Proxmox VE container (/dev/shm size, GPUs on PVE < 8.1)
description:
  - >-
    Runs on the Proxmox host. Raw C(lxc.*) keys are not in the PVE API; they exist only as lines of
    C(<pve_dir>/lxc/<vmid>.conf), after its C(key: value) lines. This module makes the wanted lines present there.
  - >-
    With O(gpus), it also reads which NVIDIA device nodes the host has (under O(dev_dir)) and returns them as
    RV(host_devices), the input of RV(dflash.ops.proxmox_lxc#module:host_devices); a GPU the host lacks is refused
    before anything changes. The proxmox_lxc role calls this module before the API call, so that a no-op converge
    makes one round trip to the host.
  - >-
    With O(shm_size_gib), or sized from O(weights_gib) exactly as dflash.ops.proxmox_lxc sizes it, the C(/dev/shm)
    tmpfs of that size (C(lxc.mount.entry: tmpfs dev/shm tmpfs
    nodev,nosuid,size=<N>g,mode=1777,create=dir 0 0)).
  - >-
    With O(gpu_devices) (hosts older than PVE 8.1, which have no C(devN)), one C(lxc.cgroup2.devices.allow: c
    <major>:* rwm) per major the nodes need - the NVIDIA driver's, C(nvidia-uvm)'s and C(nvidia-caps)' read from
    O(proc_devices), as uvm's changes between boots - and one C(lxc.mount.entry) bind per node. A whole-major allow
    of a major no character device has any more (the previous boot's uvm) is removed.
  - A wanted line replaces the lines it owns (the same mount target, the same device rule, the same single-valued
    key); every other line, and the snapshot sections, stay as they are.
  - Written under PVE's config lock (C(<lock_dir>/pve-config-<vmid>.lock), the one C(pct set) takes) the way PVE
    writes it (C(<file>.tmp.<pid>) and a rename); where pmxcfs refuses that, the file is rewritten in place with one
    write. The result's RV(write) says which.
  - The lines take effect at the container's next start.
  - >-
    A /dev/shm size the container's memory (O(memory), else the config file's C(memory:)) cannot hold together
    with O(trainer_memory_gib) is refused with the numbers, before anything is written.
version_added: 0.2.0
author: dflash.ops maintainers (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Reports the lines that would be added or removed; writes nothing (and takes no lock).
  diff_mode:
    support: full
    description: Shows the file's raw lines before and after.
extends_documentation_fragment:
  - dflash.ops.container_sizing
options:
  vmid:
    description: The container's id.
    type: int
    required: true
  pve_dir:
    description: The cluster file system's mount point (its C(lxc/<vmid>.conf) is the container's config).
    type: path
    default: /etc/pve
  shm_size_gib:
    description: Size of the container's C(/dev/shm) in GiB (e.g. RV(dflash.ops.proxmox_lxc#module:shm_size_gib));
      unset (and no O(weights_gib)) leaves the /dev/shm line alone. Not with O(weights_gib).
    type: int
  gpus:
    description: GPU indexes the container gets; their C(/dev/nvidia<N>) and the control nodes must exist on the host.
    type: list
    elements: int
    default: []
  dev_dir:
    description: Where the host's device nodes are read (C(/dev); a test directory in tests).
    type: path
    default: /dev
  absent_ok:
    description: When the container's config file does not exist yet, return RV(exists=false) instead of failing
      (the host's facts are still read).
    type: bool
    default: false
  gpu_devices:
    description: Host device nodes to bind with raw lines (hosts without C(devN)), e.g. RV(dflash.ops.proxmox_lxc#module:gpu_devices).
    type: list
    elements: str
    default: []
  proc_devices:
    description: The host's C(/proc/devices) (read for the device majors when O(gpu_devices) is given).
    type: path
    default: /proc/devices
  lines:
    description: "More raw lines, C(lxc.<key>: <value>)."
    type: list
    elements: str
    default: []
  lock_dir:
    description: Directory of PVE's container config locks.
    type: path
    default: /run/lock/lxc
seealso:
  - module: dflash.ops.proxmox_lxc
"""

EXAMPLES = r"""
- name: The host's GPU nodes and a /dev/shm for 50 GiB of weights, before the container may exist
  dflash.ops.lxc_raw_config:
    vmid: 200
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    weights_gib: 50
    absent_ok: true
  register: ct200_host

- name: /dev/shm of 57 GiB for CT 200
  dflash.ops.lxc_raw_config:
    vmid: 200
    shm_size_gib: 57

- name: GPUs by raw lines on a PVE 8.0 host, with /dev/shm
  dflash.ops.lxc_raw_config:
    vmid: 200
    shm_size_gib: "{{ ct200.shm_size_gib }}"
    gpu_devices: "{{ ct200.gpu_devices }}"
  when: ct200.gpu_passthrough == 'raw'
"""

RETURN = r"""
path:
  description: The config file.
  returned: always
  type: str
  sample: /etc/pve/lxc/200.conf
lines:
  description: The raw lines wanted.
  returned: always
  type: list
  elements: str
  sample: ["lxc.mount.entry: tmpfs dev/shm tmpfs nodev,nosuid,size=57g,mode=1777,create=dir 0 0"]
added:
  description: Lines added (or that would be).
  returned: always
  type: list
  elements: str
  sample: ["lxc.mount.entry: tmpfs dev/shm tmpfs nodev,nosuid,size=57g,mode=1777,create=dir 0 0"]
removed:
  description: Lines removed (replaced, or stale device majors).
  returned: always
  type: list
  elements: str
  sample: ["lxc.mount.entry: tmpfs dev/shm tmpfs nodev,nosuid,size=48g,mode=1777,create=dir 0 0"]
write:
  description: How the file was written - V(rename) (PVE's way) or V(in-place) (where pmxcfs refused the rename).
  returned: when written
  type: str
  sample: rename
msg:
  description: Why nothing could be read (the container does not exist yet).
  returned: in check mode or with O(absent_ok) when the config file does not exist yet
  type: str
  sample: /etc/pve/lxc/200.conf does not exist yet
exists:
  description: Whether the container's config file exists.
  returned: always
  type: bool
  sample: true
host_devices:
  description: The host's NVIDIA device nodes, as C(/dev/...) paths (empty without O(gpus)).
  returned: always
  type: list
  elements: str
  sample: [/dev/nvidia-uvm, /dev/nvidia-uvm-tools, /dev/nvidia0, /dev/nvidia1, /dev/nvidiactl]
shm_size_gib:
  description: The /dev/shm size wanted in GiB (0 when the line is left alone).
  returned: always
  type: int
  sample: 55
"""

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox.raw_config_backend import (
    argument_spec, ensure_raw_config)


def main():
    module = argument_spec().create_ansible_module(supports_check_mode=True)
    try:
        result = ensure_raw_config(module)
    except ModuleFailure as exc:
        module.fail_json(msg=str(exc), **exc.facts)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
