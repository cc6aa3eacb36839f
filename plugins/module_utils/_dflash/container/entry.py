# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""How every in-container entry answers the controller: exactly one JSON line, never a traceback."""

import json
import sys


def answer(handler, req, refusals, label):
    """Print handler(req) as one JSON line. An exception of a type in `refusals` is a refusal: failed, its message
    and its .facts; any other exception is reported as '<label>: <type>: <text>'."""
    try:
        out = handler(req)
    except refusals as exc:
        out = {"failed": True, "msg": str(exc)}
        out.update(getattr(exc, "facts", None) or {})
    except Exception as exc:  # report, never a traceback on the operator's screen
        out = {"failed": True, "msg": "%s: %s: %s" % (label, type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()
