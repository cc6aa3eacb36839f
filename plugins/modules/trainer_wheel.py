#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_wheel
short_description: Build the bundled trainer's wheel reproducibly, keyed by a hash of its sources and pins
description:
  - Builds the wheel of the trainer package in O(source) (the collection's own C(trainer/) directory) with
    C(pip wheel --no-deps --no-build-isolation) from a clean copy of its C(pyproject.toml), C(requirements.txt) and
    C(src/), with C(SOURCE_DATE_EPOCH) fixed, so that the same sources give the same bytes.
  - The wheel is cached as O(dest)/<source_hash[:16]>/<wheel>; unchanged sources and pins are hashed, not rebuilt.
  - Runs where the collection is - delegate it to C(localhost). Needs C(pip) and C(setuptools>=64) next to the
    controller's Python (no build isolation, so no network is needed).
version_added: 0.1.0
author: dflash.ops maintainers (!UNKNOWN)
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Reports whether a build is needed; a wheel that is not cached yet is built in a scratch directory (for
      its name and hash) and thrown away, so RV(wheel) is null and the cache is left as it was.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
options:
  source:
    description: The trainer's source directory (holding C(pyproject.toml)).
    type: path
    required: true
  dest:
    description: Cache directory of built wheels.
    type: path
    default: ~/.cache/dflash-ops/trainer-wheels
  force:
    description: Build even when the wheel of these sources is cached.
    type: bool
    default: false
  extras:
    description:
      - The trainer's extras (C(pyproject.toml)'s optional-dependencies) whose pinned requirements join RV(pins), e.g.
        C(fp8) (torchao, for the FP8 drafter linears C(dflash-train) uses by default on FP8 GPUs).
      - Part of RV(source_hash), so another choice is another environment in the container. An extra that is not
        declared, or a requirement in it that is not C(name==version), is refused before anything is built.
    type: list
    elements: str
    default: []
seealso:
  - module: dflash.ops.trainer_install
"""

EXAMPLES = r"""
- name: Build the trainer wheel from the collection on the controller
  dflash.ops.trainer_wheel:
    source: "{{ role_path }}/../../trainer"
  delegate_to: localhost
  run_once: true
  register: wheel

- name: The same, with the FP8 extra's pins (torchao) for the container's install
  dflash.ops.trainer_wheel:
    source: "{{ role_path }}/../../trainer"
    extras: [fp8]
  delegate_to: localhost
  run_once: true
  register: wheel
"""

RETURN = r"""
wheel:
  description: Path of the wheel on the controller; null in check mode when it is not cached yet.
  returned: always
  type: str
  sample: /root/.cache/dflash-ops/trainer-wheels/6228d8376319354b/dflash_trainer-0.1.0-py3-none-any.whl
wheel_name:
  description: The wheel's file name.
  returned: always
  type: str
  sample: dflash_trainer-0.1.0-py3-none-any.whl
sha256:
  description: The wheel's sha256.
  returned: always
  type: str
  sample: 7e0ba6d13d1cb99d37acfbff8d609fedd9154c00797186e1a27e09ea12785c11
version:
  description: The trainer's version (C(pyproject.toml)).
  returned: always
  type: str
  sample: 0.1.0
source_hash:
  description: sha256 over the relative paths and contents of the files the wheel is built from, pins included, and
    the names of O(extras).
  returned: always
  type: str
  sample: 6228d8376319354bb0e6cad4f55883efec562bf5b7cdb3aa8fad5e07adc911d1
pins:
  description: The trainer's pinned runtime dependencies (C(requirements.txt)), then those of O(extras).
  returned: always
  type: list
  elements: str
  sample: [torch==2.13.0, transformers==5.24.0]
source:
  description: The source directory, absolute.
  returned: always
  type: str
  sample: /usr/share/ansible/collections/ansible_collections/dflash/ops/trainer
"""

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.trainer_wheel_build import (
    WheelBuildError, trainer_wheel)


def argument_spec():
    return ArgumentSpec(argument_spec=dict(
        source=dict(type="path", required=True),
        dest=dict(type="path", default="~/.cache/dflash-ops/trainer-wheels"),
        force=dict(type="bool", default=False),
        extras=dict(type="list", elements="str", default=[]),
    ))


def main():
    module = argument_spec().create_ansible_module(supports_check_mode=True)
    p = module.params
    try:
        result = trainer_wheel(p["source"], p["dest"], check_mode=module.check_mode, force=p["force"],
                               extras=p["extras"])
    except (WheelBuildError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
