# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
name: concise
type: stdout
short_description: Ansible's default output, with a refused input said once, in one line
version_added: 0.1.0
author: dflash.ops maintainers (!UNKNOWN)
description:
  - The default stdout callback, except for a task result that refuses bad input (C(bad_input=true), from
    M(dflash.ops.training_inputs) or the trainer's check in M(dflash.ops.training_run)) - that is printed as one
    line, C(fatal - [host] - message), instead of the error summary followed by the same message in the result.
  - The collection's C(ansible.cfg) selects it (C(stdout_callback = dflash.ops.concise)).
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout in configuration
"""

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallback


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "dflash.ops.concise"

    def v2_runner_on_failed(self, result, ignore_errors=False):
        res = result.result
        if not res.get("bad_input") or (result.task.loop and "results" in res):
            return super(CallbackModule, self).v2_runner_on_failed(result, ignore_errors)
        if self._last_task_banner != result.task._uuid:
            self._print_task_banner(result.task)
        self._handle_warnings(res)
        self._display.display("fatal: [%s]: %s" % (self.host_label(result), res.get("msg", "bad input")),
                              color=C.COLOR_ERROR, stderr=self.get_option("display_failed_stderr"))
        if ignore_errors:
            self._display.display("...ignoring", color=C.COLOR_SKIP)
