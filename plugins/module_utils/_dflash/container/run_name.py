# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The one rule for run names (docs/design.md, the run contract); the role's preflight uses it as a test plugin."""

import re

RUN_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")  # fullmatch: "$" would let a trailing newline in
RULE = "use 1-64 letters, digits, '.', '_' or '-' (e.g. slammed5)"


def is_valid_run_name(name):
    return isinstance(name, str) and bool(RUN_NAME_RE.fullmatch(name)) and name not in (".", "..")


def validate_run_name(name):
    if not is_valid_run_name(name):
        raise ValueError("invalid run name %r: %s" % (name, RULE))
    return name
