# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations


class ModuleDocFragment(object):
    # Where a module's command runs: transport_argument_spec() in module_utils/_dflash/transport/command.py.
    DOCUMENTATION = r"""
options:
  transport:
    description:
      - V(pct) runs inside container O(vmid) through C(pct exec); the managed host is the Proxmox host.
      - V(local) runs on the managed host itself (no container).
    type: str
    choices: [pct, local]
    default: pct
  vmid:
    description: Container id (100 to 999999999); required when O(transport=pct).
    type: int
  pct_path:
    description: The C(pct) command (a name looked up on PATH, or an absolute path).
    type: str
    default: pct
"""
