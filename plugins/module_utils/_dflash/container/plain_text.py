# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Library error text as plain ASCII for the operator's summary: gloo's "GLHF! 🏖️" (an emoji, a variation
selector) or a control character made Ansible print the whole summary as one escaped string. Stdlib only."""

import unicodedata


def plain_line(text):
    """`text` with accents folded (é -> e), emoji and other non-ASCII characters dropped, control characters made
    spaces; the spacing kept (a log line's columns)."""
    folded = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    return "".join(c if c.isprintable() else " " for c in folded)


def plain(text, limit=None):
    """plain_line(text) with runs of whitespace made one space; cut to `limit` characters (with '...') when given."""
    if text is None:
        return None
    out = " ".join(plain_line(text).split())
    if limit is not None and len(out) > limit:
        out = out[:max(0, limit - 3)] + "..."
    return out
