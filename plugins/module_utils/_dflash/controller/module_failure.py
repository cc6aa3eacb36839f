# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The one exception backends raise for a module to turn into fail_json(msg=…, **facts)."""

from __future__ import annotations


class ModuleFailure(Exception):
    def __init__(self, msg, **facts):
        Exception.__init__(self, msg)
        self.facts = facts
