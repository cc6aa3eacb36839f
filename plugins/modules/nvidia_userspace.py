#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_userspace
short_description: Install the NVIDIA user-space driver of exactly the host's kernel module version in a container
description:
  - Runs on the Proxmox host (the managed host). Reads the host kernel module's version from O(host_version_file)
    (C(NVRM version) line; proprietary and open kernel modules); where that file does not exist the host has no
    NVIDIA driver and the module returns C(skipped) with the message C(no NVIDIA driver on <host>) followed by
    C(nothing to install (CPU container)).
  - The container's installed version is read from the C(libnvidia-ml.so.<version>) files of its library
    directories; the same version there means C(changed=false).
  - Otherwise C(NVIDIA-Linux-<arch>-<version>.run) is taken from O(installer_dir) on the Proxmox host (refused in
    one line naming the file when it is not there), pushed into the container (C(pct push)) and run there with
    O(installer_args), which must leave the kernel module out. A marker O(marker) records what was installed.
  - With O(verify), NVML inside the container (C(libnvidia-ml.so.1) through ctypes, no Python package needed) must
    report the host's driver version and list every GPU of O(expected_gpus), by C(/dev/nvidia<N>) number.
version_added: 0.1.0
author: dflash.ops maintainers (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Reports whether the driver would be installed (and warns when the installer is missing);
      pushes and installs nothing.
  diff_mode:
    support: full
    description: Shows the container's libnvidia-ml versions before and after.
extends_documentation_fragment:
  - dflash.ops.transport
options:
  host_version_file:
    description: The host's driver version file; absent means no NVIDIA driver (skipped). Tests point it elsewhere.
    type: path
    default: /proc/driver/nvidia/version
  installer_dir:
    description: Directory on the Proxmox host holding C(NVIDIA-Linux-<arch>-<version>.run) installers.
    type: path
    default: /var/lib/dflash/nvidia
  installer_args:
    description:
      - Flags of the installer. Must contain C(--no-kernel-module) (or C(--no-kernel-modules), its name from driver
        560 on), because the container shares the host's kernel module and cannot build or load its own.
      - The default also passes C(--no-drm) (no nvidia-drm module either; redundant, kept as a second guard),
        C(--no-nouveau-check) (nouveau is the host kernel's business; the installer would write modprobe blacklists),
        C(--no-x-check) (no X server), and C(--silent --no-questions --ui=none) (no prompts; C(--silent) also
        accepts the license).
    type: list
    elements: str
    default: [--no-kernel-module, --no-drm, --no-nouveau-check, --no-x-check, --silent, --no-questions, --ui=none]
  staging_dir:
    description: Directory inside the container the installer is pushed into and unpacked in (removed after).
    type: path
    default: /var/tmp/dflash-nvidia
  marker:
    description: JSON record inside the container of the version installed by this module and its flags.
    type: path
    default: /etc/dflash/nvidia-userspace.json
  expected_gpus:
    description: GPUs (C(/dev/nvidia<N>) numbers, the host's indexes) NVML in the container must list.
    type: list
    elements: int
    default: []
  verify:
    description: Ask NVML inside the container afterwards. Off only where the driver is a stand-in.
    type: bool
    default: true
  python:
    description: Python interpreter inside the container (default python3; locally the module's own).
    type: str
  timeout:
    description: Seconds for each step in the container (the installer included).
    type: float
    default: 1800
seealso:
  - module: dflash.ops.pct_exec
notes:
  - The driver version must match the host's exactly; NVML refuses to start otherwise.
"""

EXAMPLES = r"""
- name: NVIDIA user space of the host's driver in CT 200, checked against GPUs 0-7
  dflash.ops.nvidia_userspace:
    vmid: 200
    installer_dir: /var/lib/dflash/nvidia
    expected_gpus: [0, 1, 2, 3, 4, 5, 6, 7]

- name: Would CT 201 need an install?
  dflash.ops.nvidia_userspace:
    vmid: 201
    verify: false
  check_mode: true
  register: nvidia
"""

RETURN = r"""
host_version:
  description: The host kernel module's driver version; null when the host has no NVIDIA driver.
  returned: always
  type: str
  sample: 550.127.05
host_version_file:
  description: The version file that was looked for.
  returned: when skipped
  type: str
  sample: /proc/driver/nvidia/version
skip_reason:
  description: Why nothing was done.
  returned: when skipped
  type: str
  sample: "no NVIDIA driver on pve1: nothing to install (CPU container)"
host_module:
  description: V(open) or V(proprietary) kernel module on the host.
  returned: when the host has a driver
  type: str
  sample: proprietary
installer:
  description: The installer of exactly the host's version, on the Proxmox host.
  returned: when the host has a driver
  type: str
  sample: /var/lib/dflash/nvidia/NVIDIA-Linux-x86_64-550.127.05.run
installer_present:
  description: Whether RV(installer) exists.
  returned: when the host has a driver
  type: bool
  sample: true
installer_args:
  description: The installer's flags.
  returned: when the host has a driver
  type: list
  elements: str
  sample: [--no-kernel-module, --silent]
installed:
  description: Whether the installer ran.
  returned: when the host has a driver
  type: bool
  sample: true
previous_versions:
  description: Versions of C(libnvidia-ml.so.<version>) in the container before.
  returned: when the host has a driver
  type: list
  elements: str
  sample: [535.183.01]
installed_versions:
  description: Versions of C(libnvidia-ml.so.<version>) in the container now.
  returned: when the host has a driver
  type: list
  elements: str
  sample: [550.127.05]
install_s:
  description: Seconds the installer ran.
  returned: when installed
  type: float
  sample: 41.2
installer_output:
  description: Last lines of the installer's output.
  returned: when installed
  type: list
  elements: str
  sample: []
nvml:
  description: What NVML in the container reports (driver version, GPUs with minor number, name and UUID).
  returned: when verify is true and the host has a driver
  type: dict
  sample: {driver_version: 550.127.05, minors: [0, 1], gpus: [{index: 0, minor: 0, name: NVIDIA H200,
           uuid: GPU-0d4c…}], inaccessible: [], unexpected: []}
verify_note:
  description: Why NVML was not asked.
  returned: when verify is false and the host has a driver
  type: str
  sample: "NVML verification skipped (verify=false): the driver is a stand-in or the GPUs are checked elsewhere"
"""

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.nvidia_userspace_backend import (
    argument_spec, ensure_userspace)


def main():
    module = argument_spec().create_ansible_module(supports_check_mode=True)
    try:
        result = ensure_userspace(module)
    except ModuleFailure as exc:
        module.fail_json(msg=str(exc), **exc.facts)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
