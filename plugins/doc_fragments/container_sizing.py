# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations


class ModuleDocFragment(object):
    # /dev/shm size and the memory check: sizing_argument_spec() in module_utils/_dflash/proxmox/memory.py.
    DOCUMENTATION = r"""
options:
  memory:
    description:
      - Memory limit of the container in MiB; must hold /dev/shm's contents plus the trainer (see O(weights_gib)).
      - Unset, the container's current memory (PVE's default of 512 for a new one) enters the check.
    type: int
  weights_gib:
    description: Size of the weights staged in /dev/shm (GiB); sizes /dev/shm and enters the memory check.
    type: float
  shm_margin:
    description: Fraction added to O(weights_gib) for /dev/shm.
    type: float
    default: 0.1
  trainer_memory_gib:
    description: Host memory (GiB) the trainer needs beside /dev/shm; enters the memory check.
    type: float
    default: 0
"""
