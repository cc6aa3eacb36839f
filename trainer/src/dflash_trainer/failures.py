"""Failures whose message already says everything in one line (stdlib only: cli.py imports it before torch)."""

from __future__ import annotations


class ExplainedFailure(Exception):
    """Ends the trainer with exit 1, the message as its one error line and in the heartbeat; no traceback,
    because the message names the path, the numbers and what to do."""
