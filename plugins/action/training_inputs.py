# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Action dflash.ops.training_inputs: the operator's inputs of a training play, checked on the controller before
the role's argument spec sees its derived variables (module_utils/_dflash/controller/operator_inputs.py). Its
failure is a result (failed, msg, bad_input), never an exception, so Ansible prints the one line once."""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.operator_inputs import (
    NAMES, InputError, check, refuse_templated_run)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset()

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        variables = {}
        try:
            # the name as typed, before templating would run what it holds
            refuse_templated_run(task_vars.get("run"))
            for name in NAMES:
                if name in task_vars:
                    try:
                        variables[name] = self._templar.template(task_vars[name])
                    except AnsibleError as exc:
                        first = (str(getattr(exc, "message", "") or exc).strip().splitlines() or ["?"])[0]
                        raise InputError("%s cannot be resolved (%s); fix its value in the inventory or -e"
                                         % (name, first))
            run = check(variables)
        except InputError as exc:
            result.update(failed=True, changed=False, bad_input=True, msg="%s; nothing was run" % exc)
            return result
        result.update(changed=False, run=run, msg="inputs of run %s are valid" % run)
        return result
