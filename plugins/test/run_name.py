# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Jinja test `dflash.ops.run_name`: the collection's one run-name rule, for roles' preflight checks."""

from __future__ import annotations

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.run_name import is_valid_run_name


class TestModule(object):
    def tests(self):
        return {"run_name": is_valid_run_name}
