# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Memory arithmetic of a training container (docs/proxmox.md, "Memory and /dev/shm").

/dev/shm is a tmpfs whose pages count against the container's memory cgroup, so the container's `memory` must hold
the staged weights (the /dev/shm size) and the trainer's own host memory at once.
"""

from __future__ import annotations

import math

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec

MIB_PER_GIB = 1024
DEFAULT_MEMORY = 512  # PVE's default memory (MiB) for a container created without one


def sizing_argument_spec():
    """memory, weights_gib, shm_margin, trainer_memory_gib: the options of proxmox_lxc and lxc_raw_config that size
    /dev/shm and check that the container's memory holds it (doc fragment dflash.ops.container_sizing)."""
    return ArgumentSpec(argument_spec=dict(
        memory=dict(type="int"),
        weights_gib=dict(type="float"),
        shm_margin=dict(type="float", default=0.1),
        trainer_memory_gib=dict(type="float", default=0),
    ))


def shm_size_gib(weights_gib, margin):
    """/dev/shm size in whole GiB: the weights plus a fraction `margin` for them, rounded up (0 without weights)."""
    if weights_gib is None or weights_gib <= 0:
        return 0
    if margin is None or margin < 0:
        raise ValueError("shm_margin must be 0 or more (a fraction of the weights, e.g. 0.1), got %r" % (margin,))
    # round() first: 50 * 1.1 is 55.000000000000007 in floating point, which must not become 56.
    return int(math.ceil(round(weights_gib * (1.0 + margin), 6)))


def memory_needed_mib(shm_gib, trainer_gib):
    """MiB the container needs: /dev/shm filled to its size, plus the trainer's host memory."""
    return int(math.ceil((shm_gib + (trainer_gib or 0)) * MIB_PER_GIB))


def check_memory(memory_mib, shm_gib, trainer_gib):
    """Refuse a `memory` that cannot hold /dev/shm's contents plus the trainer, with the numbers and the fix."""
    needed = memory_needed_mib(shm_gib, trainer_gib)
    if memory_mib is not None and memory_mib < needed:
        raise ValueError(
            "memory %d MiB < /dev/shm %s GiB + trainer %s GiB = %d MiB (tmpfs pages count against the container's "
            "memory): raise memory to at least %d, or lower weights_gib, shm_margin or trainer_memory_gib"
            % (memory_mib, _num(shm_gib), _num(trainer_gib or 0), needed, needed))
    return needed


def _num(value):
    return ("%d" % value) if float(value).is_integer() else ("%g" % value)
