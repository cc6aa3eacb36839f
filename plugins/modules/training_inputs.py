#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: training_inputs
short_description: Check the inputs an operator gives a training play, each where it enters
description:
  - Reads the play's variables by the names an operator writes them (C(run), C(force), C(dflash_target_gpus),
    C(dflash_drafter_gpus), C(dflash_*_timeout), C(dflash_keep_records), C(dflash_nproc_per_node), C(dflash_vmid),
    C(dflash_run_defaults), C(dflash_runs)), or the role's C(training_run_name), C(training_runs) and
    C(training_run_defaults) where the role is used directly.
  - Fails with one line that names the variable as written, what is wrong and a valid example, for a missing,
    invalid or undeclared run name, a GPU list that is not GPU indexes (a list, an index or a comma string such as
    C(0,1,2)), a timeout that is not seconds, a boolean that is not true or false, and a run's C(trainer_args),
    C(env), C(gpus) or C(nproc_per_node) of a wrong type. The failure carries C(bad_input=true) and no traceback.
  - Runs on the controller (an action plugin); the collection's training playbooks run it before the role
    M(dflash.ops.training_run) is reached, and the role C(dflash.ops.training) runs it first.
version_added: 0.1.0
author: dflash.ops maintainers (!UNKNOWN)
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
    support: full
seealso:
  - module: dflash.ops.training_run
"""

EXAMPLES = r"""
- name: Check the operator's inputs before the role
  dflash.ops.training_inputs:
"""

RETURN = r"""
run:
  description: The run the inputs name (when they are valid).
  returned: success
  type: str
  sample: slammed5
bad_input:
  description: True when an input was refused (nothing was run).
  returned: failure
  type: bool
  sample: true
"""
