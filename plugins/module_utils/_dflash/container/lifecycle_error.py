# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The run lifecycle's one error: a refusal or failure reported as failed=true with its line (run_lifecycle.py,
run_launch.py). Stdlib only."""


class LifecycleError(Exception):
    """A refusal or failure to report as failed=true with this one-line message (plus extra facts)."""

    def __init__(self, msg, **facts):
        Exception.__init__(self, msg)
        self.facts = facts


def os_text(exc):
    """An OSError of a run-directory write as the one-line refusal's words."""
    return "could not write %s: %s" % (exc.filename or "the run directory", exc.strerror or exc)
