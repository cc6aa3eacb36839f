# -*- coding: utf-8 -*-
# Copyright: dflash.ops contributors
# Apache License 2.0
"""The one exception backends raise for a module to turn into fail_json(msg=…, **facts)."""

from __future__ import annotations


class ModuleFailure(Exception):
    def __init__(self, msg, **facts):
        Exception.__init__(self, msg)
        self.facts = facts
