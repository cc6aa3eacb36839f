#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_install
short_description: Install the bundled trainer's wheel into a new virtual environment in the container, then switch to it
description:
  - Installs O(wheel) (built by M(dflash.ops.trainer_wheel)) and its O(pins) into a NEW virtual environment
    O(venvs_root)/<key> inside a Proxmox LXC container (through C(pct exec) and C(pct push)) or on the host itself
    (O(transport=local)), where <key> is the first 16 digits of O(source_hash) (the trainer's sources and pins).
  - Order - push the wheel (and O(wheelhouse)'s files) into a staging directory, C(python3 -m venv), C(pip install),
    run C(<venv>/bin/dflash-train --help), write C(<venv>/dflash-install.json) (version, source_hash, installed_at),
    then point O(link) at the new environment with one rename of a temporary symlink. A failed install (a broken
    wheel, pip failing, C(--help) failing) removes the half-built environment and leaves O(link) where it was, so
    the previous trainer keeps working.
  - The same key already behind O(link) is a no-op. A key whose environment is still kept is switched to without
    reinstalling. A real directory at O(link) (a venv made by hand) is adopted - renamed to
    O(venvs_root)/C(adopted-<stamp>) - and replaced by the symlink; its scripts keep working through the link.
  - Old environments are pruned, keeping O(keep) in all; the new one and the previous one are never pruned.
version_added: 0.1.0
author: dflash.ops maintainers (!UNKNOWN)
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Reports whether the environment would be installed or switched and which environments would be pruned;
      pushes and writes nothing.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: Shows the environment O(link) points at before and after, and the environments pruned.
extends_documentation_fragment:
  - dflash.ops.transport
options:
  wheel:
    description: The trainer wheel on the managed host (the role copies it there from the controller).
    type: path
    required: true
  wheel_sha256:
    description: The wheel's sha256; the copy in the container is checked against it before installing.
    type: str
    required: true
  source_hash:
    description: Hash of the trainer's sources and pins (from M(dflash.ops.trainer_wheel)); names the environment.
    type: str
    required: true
  version:
    description: The trainer's version (the wheel's); recorded in C(dflash-install.json).
    type: str
    required: true
  pins:
    description: Requirement specifiers installed with the wheel (C(name==version)); pip options are refused.
    type: list
    elements: str
    default: []
  wheelhouse:
    description:
      - Directory of wheels on the managed host (torch built for the container's CUDA and the other pins); its
        files are pushed into the container and pip installs offline (C(--no-index)) from them.
    type: path
  container_wheelhouse:
    description: Directory of wheels already inside the container (a bind mount); pip installs offline from it.
    type: path
  index_url:
    description: Package index pip uses instead (for example C(https://download.pytorch.org/whl/cu128)); without
      O(index_url), O(wheelhouse) or O(container_wheelhouse) pip uses its default index.
    type: str
  venvs_root:
    description: Directory holding the environments side by side.
    type: path
    default: /opt/dflash/venvs
  link:
    description: The symlink the trainer command goes through (C(<link>/bin/dflash-train)).
    type: path
    default: /opt/dflash/venv
  keep:
    description: Environments kept in all (at least 1); the new and the previous one always stay.
    type: int
    default: 3
  python:
    description: Python at the target that runs the install and makes the venv (C(python3) in a container; the
      module's own interpreter with O(transport=local)).
    type: str
  pip_timeout:
    description: Seconds pip may take.
    type: float
    default: 1800
  compile_bytecode:
    description:
      - Whether pip byte-compiles the installed packages (its default). V(false) passes C(--no-compile), which
        takes most of pip's CPU time off an install of torch; Python then compiles the modules the trainer imports
        at its first start. Not part of the environment's identity - changing it alone reinstalls nothing.
    type: bool
    default: true
  timeout:
    description: Seconds each transport call may take.
    type: float
    default: 3600
  progress_file:
    description:
      - A file in the container where the install keeps its phase while it runs (JSON - C(phase), C(updated_at)) -
        waiting for another install, planning, checking the wheel, creating the venv, pip install, verifying,
        switching the link. The role runs this module with C(async) and reads it to print the phase. None is kept
        when not given.
    type: path
seealso:
  - module: dflash.ops.trainer_wheel
  - module: dflash.ops.training_run
notes:
  - C(training_run) with O(dflash.ops.training_run#module:expect_trainer_version) refuses to launch a trainer
    whose C(dflash-install.json) records an older version.
"""

EXAMPLES = r"""
- name: Build the trainer wheel from the collection on the controller
  dflash.ops.trainer_wheel:
    source: "{{ role_path }}/../../trainer"
  delegate_to: localhost
  run_once: true
  register: wheel

- name: Install it in CT 200 offline from a wheelhouse on the Proxmox host
  dflash.ops.trainer_install:
    vmid: 200
    wheel: /var/tmp/dflash-ops/{{ wheel.wheel_name }}
    wheel_sha256: "{{ wheel.sha256 }}"
    source_hash: "{{ wheel.source_hash }}"
    version: "{{ wheel.version }}"
    pins: "{{ wheel.pins }}"
    wheelhouse: /srv/wheels/cu128

- name: Install it from the PyTorch CUDA index
  dflash.ops.trainer_install:
    vmid: 200
    wheel: /var/tmp/dflash-ops/{{ wheel.wheel_name }}
    wheel_sha256: "{{ wheel.sha256 }}"
    source_hash: "{{ wheel.source_hash }}"
    version: "{{ wheel.version }}"
    pins: "{{ wheel.pins }}"
    index_url: https://download.pytorch.org/whl/cu128
"""

RETURN = r"""
key:
  description: The environment's name under O(venvs_root) (16 digits of O(source_hash)).
  returned: always
  type: str
  sample: 6228d8376319354b
version:
  description: The trainer version installed (or that would be).
  returned: always
  type: str
  sample: 0.1.0
venv:
  description: The environment of this key.
  returned: always
  type: str
  sample: /opt/dflash/venvs/6228d8376319354b
link:
  description: The symlink that now points at RV(venv).
  returned: always
  type: str
  sample: /opt/dflash/venv
previous:
  description: What O(link) pointed at before (resolved); null when it did not exist.
  returned: always
  type: str
  sample: /opt/dflash/venvs/0b1c2d3e4f5a6b7c
up_to_date:
  description: Whether O(link) already pointed at a complete environment of this key.
  returned: always
  type: bool
  sample: false
installed:
  description: Whether a new environment was built (false for a no-op, a check-mode run or a switch to a kept one).
  returned: always
  type: bool
  sample: true
pruned:
  description: Environments removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
  sample: [/opt/dflash/venvs/adopted-20261130-101500]
adopted:
  description: Where a real directory found at O(link) was moved; null when none was.
  returned: when something was changed (not in check mode)
  type: str
  sample: /opt/dflash/venvs/adopted-20261130-101500
pushed:
  description: Files pushed into the container (the wheel, plus O(wheelhouse)'s files).
  returned: when a new environment was built
  type: int
  sample: 1
timings:
  description: Seconds of the steps (venv, pip, verify for a new environment; switch, which includes adopting a
    hand-made venv).
  returned: when something was changed (not in check mode)
  type: dict
  sample: {venv: 3.1, pip: 28.4, verify: 2.2, switch: 0.01}
output_tail:
  description: The last lines pip or C(dflash-train --help) printed when they failed.
  returned: when the install failed
  type: list
  elements: str
  sample: ["ERROR: No matching distribution found for torch==2.13.0"]
"""

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.trainer_install_backend import (
    argument_spec, install_trainer)


def main():
    module = argument_spec().create_ansible_module(supports_check_mode=True)
    try:
        result = install_trainer(module)
    except ModuleFailure as exc:
        module.fail_json(msg=str(exc), **exc.facts)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
