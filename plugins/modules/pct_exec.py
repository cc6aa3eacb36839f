#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.ops contributors
# Apache License 2.0

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
author: dflash.ops maintainers
attributes:
  check_mode:
    support: partial
    details: Nothing runs in check mode; the result says whether O(creates)/O(removes) would skip it.
  diff_mode:
    support: none
options:
  vmid:
    description: Container id; required when O(transport=pct).
    type: int
  transport:
    description: V(pct) runs inside the container; V(local) on the managed host.
    type: str
    choices: [pct, local]
    default: pct
  pct_path:
    description: The C(pct) command (name on PATH or absolute path).
    type: str
    default: pct
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
argv:
  description: The full argument vector that was run on the host.
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.ops.plugins.module_utils._dflash.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.pct_exec_backend import run_command


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vmid=dict(type="int"),
            transport=dict(type="str", default="pct", choices=["pct", "local"]),
            pct_path=dict(type="str", default="pct"),
            argv=dict(type="list", elements="str"),
            cmd=dict(type="str"),
            env=dict(type="dict", default={}),
            login_shell=dict(type="bool", default=False),
            chdir=dict(type="path"),
            creates=dict(type="path"),
            removes=dict(type="path"),
            timeout=dict(type="float"),
            expected_rc=dict(type="list", elements="int", default=[0]),
        ),
        required_one_of=[("argv", "cmd")],
        mutually_exclusive=[("argv", "cmd")],
        required_if=[("transport", "pct", ("vmid",))],
        supports_check_mode=True,
    )
    try:
        result = run_command(module)
    except ModuleFailure as exc:
        module.fail_json(msg=str(exc), **exc.facts)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
