#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pct_exec
short_description: Run one command inside a Proxmox LXC container through C(pct exec)
description:
  - Runs O(argv) (or O(cmd), split like a shell would but never run by one) inside container O(vmid) with
    C(pct exec <vmid> -- env -i …), stdin closed and no terminal, with exactly the environment given in O(env).
  - With O(transport=local) the same command runs on the managed host itself.
  - Fails on a non-zero exit status unless O(expected_rc) includes it.
version_added: 0.1.0
author: dflash.ops maintainers (!UNKNOWN)
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: partial
    details: Nothing runs in check mode; the result says whether O(creates)/O(removes) would skip it.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
    details: An arbitrary command has no before and after to show; O(creates) and O(removes) say whether it runs.
extends_documentation_fragment:
  - dflash.ops.transport
options:
  argv:
    description: The command as a list; each element is passed literally.
    type: list
    elements: str
  cmd:
    description: The command as one string, split with shell quoting rules (no shell runs it).
    type: str
  env:
    description: Environment variables of the command; nothing else is inherited.
    type: dict
    default: {}
  login_shell:
    description: Run through C(bash -l) so the container's profile sets PATH and friends.
    type: bool
    default: false
  chdir:
    description: Working directory inside the container.
    type: path
  creates:
    description: Skip the command when this path exists inside the container.
    type: path
  removes:
    description: Skip the command when this path does not exist inside the container.
    type: path
  timeout:
    description: Seconds before the command (and its process group) is killed.
    type: float
  expected_rc:
    description: Exit statuses that count as success.
    type: list
    elements: int
    default: [0]
seealso:
  - module: dflash.ops.training_run
"""

EXAMPLES = r"""
- name: Show the GPUs seen by CT 200
  dflash.ops.pct_exec:
    vmid: 200
    argv: [nvidia-smi, -L]

- name: Create the trainer's virtual environment once
  dflash.ops.pct_exec:
    vmid: 200
    cmd: python3 -m venv /opt/dflash/venv
    creates: /opt/dflash/venv/bin/python

- name: Run a login-shell command with an explicit environment
  dflash.ops.pct_exec:
    vmid: 200
    argv: [python3, -c, "import os; print(os.environ['HF_HOME'])"]
    env: {HF_HOME: /workspace/hf}
    login_shell: true
"""

RETURN = r"""
rc:
  description: Exit status of the command.
  returned: when it ran
  type: int
  sample: 0
stdout:
  description: Standard output.
  returned: when it ran
  type: str
  sample: "GPU 0: NVIDIA H200"
stderr:
  description: Standard error.
  returned: when it ran
  type: str
  sample: ""
stdout_lines:
  description: Standard output split into lines.
  returned: when it ran
  type: list
  elements: str
  sample: ["GPU 0: NVIDIA H200"]
stderr_lines:
  description: Standard error split into lines.
  returned: when it ran
  type: list
  elements: str
  sample: []
argv:
  description: The full argument vector that was (or, in check mode, would be) run on the host.
  returned: always
  type: list
  elements: str
  sample: [pct, exec, "200", --, env, -i, --, "PATH=/usr/bin:/bin", nvidia-smi, -L]
skipped_reason:
  description: Why the command did not run (creates/removes).
  returned: when skipped
  type: str
  sample: /opt/dflash/venv/bin/python exists
"""

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.pct_exec_backend import (
    argument_spec, run_command)


def main():
    module = argument_spec().create_ansible_module(supports_check_mode=True)
    try:
        result = run_command(module)
    except ModuleFailure as exc:
        module.fail_json(msg=str(exc), **exc.facts)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
