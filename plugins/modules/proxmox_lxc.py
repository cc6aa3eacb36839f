#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: proxmox_lxc
short_description: Create, update, start, stop or destroy a Proxmox VE container for GPU training, through its API
description:
  - Manages container O(vmid) on O(node) through the Proxmox VE HTTP API (proxmoxer). It runs wherever the API is
    reachable - the controller (C(delegate_to)) or the Proxmox host itself; it needs nothing else of the host.
  - Creates the container from O(ostemplate), or updates an existing one to match - only the options given are
    managed. The update reads the config and its C(digest), then sends only the changed keys, a C(delete) of the
    C(mpN)/C(netN)/C(devN) entries no longer wanted, and that digest, in one request, so a concurrent edit is never
    overwritten (it fails with one line instead - run again). Nothing is sent when everything matches.
  - GPU passthrough from O(gpus) - C(devN) entries for C(/dev/nvidia<N>), C(nvidiactl), C(nvidia-uvm), and
    C(nvidia-uvm-tools) and C(nvidia-caps/*) where O(host_devices) lists them. On PVE older than 8.1 (no C(devN))
    none are set; the result's RV(gpu_passthrough) is V(raw) and M(dflash.ops.lxc_raw_config) writes raw lines on the
    host instead.
  - Memory for a target staged in C(/dev/shm) (tmpfs pages count against the container's memory) - with
    O(weights_gib), /dev/shm is sized O(weights_gib) × (1 + O(shm_margin)) rounded up to whole GiB (RV(shm_size_gib);
    the raw mount line is written by M(dflash.ops.lxc_raw_config)), and a O(memory) below that plus
    O(trainer_memory_gib) is refused with the numbers.
  - Refused in one line before anything changes - a vmid that is a VM, a missing node, a missing template or storage,
    bad credentials, keys only C(root@pam) may set (C(devN), bind mounts, feature flags other than nesting) asked of
    another user or of an API token (with the two ways out), create-only keys (O(rootfs) size or storage,
    O(unprivileged)) that differ on an existing container.
  - Waits for each task (create, start, shutdown, stop, destroy) to stop and reports its exit status; a task that
    did not end OK fails with its text.
version_added: 0.2.0
author: dflash.ops maintainers (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Reads the node, the container and its config, and reports what would be created, changed, started,
      stopped or destroyed; sends nothing that changes anything.
  diff_mode:
    support: full
    description: Shows each changed config key before and after (all keys on create and destroy).
extends_documentation_fragment:
  - dflash.ops.proxmox_api
  - dflash.ops.container_sizing
options:
  node:
    description: The Proxmox VE node the container lives on.
    type: str
    required: true
  vmid:
    description: The container's id.
    type: int
    required: true
  state:
    description:
      - V(present) creates or updates the container and leaves it running or stopped as it is (a new one stays
        stopped).
      - V(started) and V(stopped) also start it, or shut it down (O(stop_timeout), then forced).
      - V(absent) stops (hard) and destroys it.
    type: str
    choices: [present, started, stopped, absent]
    default: present
  ostemplate:
    description: Template volume to create the container from, e.g. C(local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst);
      needed only to create it.
    type: str
  hostname:
    description: The container's host name.
    type: str
  cores:
    description: CPU cores.
    type: int
  swap:
    description: Swap in MiB.
    type: int
  rootfs:
    description:
      - Root disk, C(STORAGE:GiB) (e.g. V(local-lvm:64)); used at creation.
      - On an existing container a smaller disk or another storage is refused naming the fix (C(pct resize),
        C(pct move-volume)); a larger one is accepted.
    type: str
  mounts:
    description:
      - Mount points C(mp0), C(mp1), … in this order. Given (even empty), C(mpN) entries beyond the list are deleted.
      - A host path as O(mounts[].source) is a bind mount, which only C(root@pam) may set.
    type: list
    elements: dict
    suboptions:
      source:
        description: Host path (bind mount) or C(STORAGE:GiB) (a new volume).
        type: str
        required: true
      target:
        description: Path inside the container.
        type: str
        required: true
      read_only:
        description: Mount read-only (C(ro=1)).
        type: bool
        default: false
      options:
        description: More mount point properties, comma-separated (e.g. V(backup=0)).
        type: str
  features:
    description: >-
      Feature flags, e.g. C({nesting: true}); a false flag is left out. Only C(root@pam) may set flags
      other than nesting.
    type: dict
  unprivileged:
    description: Create an unprivileged container (PVE's default); fixed at creation.
    type: bool
  onboot:
    description: Start the container when the host boots.
    type: bool
  nets:
    description:
      - Network interfaces C(net0), C(net1), … as PVE property strings (V(name=eth0,bridge=vmbr0,ip=dhcp)). An
        interface matches when every property given has that value (PVE adds C(hwaddr) and C(type)); a changed one
        keeps its MAC address unless C(hwaddr) is given. Given (even empty), C(netN) beyond the list are deleted.
    type: list
    elements: str
  config:
    description: >-
      Other config keys of the API (e.g. C({cpulimit: 16, startup: "order=1"})), compared as strings.
    type: dict
  gpus:
    description:
      - GPU indexes to pass through (C(/dev/nvidia<N>)); the control nodes come with them. Given (even empty),
        C(devN) entries beyond the generated ones are deleted (PVE >= 8.1).
    type: list
    elements: int
  host_devices:
    description:
      - The NVIDIA device nodes that exist on the Proxmox host (C(/dev/nvidia0), C(/dev/nvidiactl),
        C(/dev/nvidia-uvm), C(/dev/nvidia-caps/nvidia-cap1), …); needed with O(gpus). The M(dflash.ops.proxmox_lxc)
        role reads them on the host, as this module may run elsewhere.
    type: list
    elements: str
  stop_timeout:
    description: Seconds a shutdown (O(state=stopped)) may take before the container is stopped hard.
    type: int
    default: 120
  task_timeout:
    description: Seconds to wait for each task to stop.
    type: int
    default: 600
seealso:
  - module: dflash.ops.lxc_raw_config
  - name: community.proxmox.proxmox (cannot set devN or raw lxc keys)
    description: The general container module; use it for containers without GPUs.
    link: https://docs.ansible.com/ansible/latest/collections/community/proxmox/proxmox_module.html
notes:
  - Only the exact user C(root@pam) (password or ticket, not a token) may set C(devN) or bind mounts. Converging an
    existing container whose devices and mounts already match needs no such key, so a token works for that.
  - Changes to a running container other than memory, swap, cores, host name and onboot take effect at its next
    start (a warning says which).
  - No root password is set in the container (C(pct exec) needs none).
"""

EXAMPLES = r"""
- name: CT 200 with 8 GPUs, memory for a 27B target in /dev/shm, the model store read-only
  dflash.ops.proxmox_lxc:
    api_host: 10.1.2.6
    api_user: root@pam
    api_password: "{{ vault_pve_root_password }}"
    ca_path: files/pve-root-ca.pem
    node: pve1
    vmid: 200
    state: started
    ostemplate: local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst
    hostname: dflash-train
    cores: 64
    memory: 196608
    swap: 0
    rootfs: local-lvm:256
    unprivileged: false
    features: {nesting: true}
    nets: ["name=eth0,bridge=vmbr0,ip=dhcp"]
    mounts:
      - {source: /mnt/models, target: /mnt/models, read_only: true}
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    host_devices: "{{ nvidia_nodes }}"
    weights_gib: 51
    trainer_memory_gib: 96
  delegate_to: localhost
  register: ct200

- name: Converge an existing container with an API token (its devices already set)
  dflash.ops.proxmox_lxc:
    api_host: 10.1.2.6
    api_token_id: root@pam!ansible
    api_token_secret: "{{ vault_pve_token_secret }}"
    node: pve1
    vmid: 200
    memory: 262144

- name: Destroy it
  dflash.ops.proxmox_lxc:
    api_host: 10.1.2.6
    api_password: "{{ vault_pve_root_password }}"
    node: pve1
    vmid: 200
    state: absent
"""

RETURN = r"""
vmid:
  description: The container's id.
  returned: always
  type: int
  sample: 200
node:
  description: Its node.
  returned: always
  type: str
  sample: pve1
status:
  description: Its status afterwards (in check mode, what it would be) - V(running), V(stopped) or V(absent).
  returned: always
  type: str
  sample: running
created:
  description: Whether it was (or would be) created.
  returned: always
  type: bool
  sample: false
changes:
  description: Each config key set (or to set), with its value before (null when unset) and after.
  returned: always
  type: dict
  sample: {memory: {before: "131072", after: "196608"}}
deleted:
  description: Config keys deleted (on destroy, every key).
  returned: always
  type: list
  elements: str
  sample: [mp1]
tasks:
  description: The tasks run, each with its type, UPID, exit status and seconds waited.
  returned: always
  type: list
  elements: dict
  sample: [{type: vzstart, upid: "UPID:pve1:0000A1B2:0001C3D4:6790A0B1:vzstart:200:root@pam:", exitstatus: OK,
            seconds: 1.2}]
pve_version:
  description: The PVE version the API reports.
  returned: always
  type: str
  sample: 8.2.4
gpu_passthrough:
  description: How the GPUs are passed - V(devN) (API), V(raw) (PVE < 8.1; lines by M(dflash.ops.lxc_raw_config)),
    V(none) (no GPUs).
  returned: always
  type: str
  sample: devN
gpu_devices:
  description: The host device nodes passed through, in C(devN) order.
  returned: always
  type: list
  elements: str
  sample: [/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools]
shm_size_gib:
  description: The /dev/shm size wanted (0 without O(weights_gib)).
  returned: always
  type: int
  sample: 57
memory_needed_mib:
  description: /dev/shm plus the trainer's memory, in MiB - the least O(memory) accepted.
  returned: always
  type: int
  sample: 156672
"""

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox.lxc_backend import (
    argument_spec, manage_container)


def main():
    module = argument_spec().create_ansible_module(supports_check_mode=True)
    try:
        result = manage_container(module)
    except ModuleFailure as exc:
        module.fail_json(msg=str(exc), **exc.facts)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
