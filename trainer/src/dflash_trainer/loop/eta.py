"""How far the run is and when it ends: step of total, the share done and an ETA, for the log lines, metrics.jsonl
and the heartbeat (training_status prints them).

The run ends at the first of two ends: its optimizer steps (epochs, capped by --max-steps) or its time budget
(--time-budget-min, training time). The ETA is the sooner of the two: the steps left at the wall-clock seconds per
step measured since this process's first step (checkpoint writes included: they delay the end too), and the
budget's seconds of training left. Pure Python: the loop calls it once per optimizer step.
"""

from __future__ import annotations

import time


def format_eta(seconds: float | None) -> str:
    """1h02m, 4m05s, 12s; '?' while unknown."""
    if seconds is None:
        return "?"
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Eta:
    """`total_steps`: the run's optimizer steps; `budget_s`: the time budget in seconds (None: none). The pace is
    this process's own (from its first step on), not a previous process's; `clock` is time.monotonic."""

    def __init__(self, total_steps: int, budget_s: float | None, clock=time.monotonic):
        self.total_steps, self.budget_s, self.clock = total_steps, budget_s, clock
        self.first: tuple[int, float] | None = None  # (step, clock) of this process's first update
        self.fields: dict = {}

    def update(self, step: int, train_s: float) -> dict:
        """The progress fields after optimizer step `step` at `train_s` seconds of training (kept in .fields)."""
        now = self.clock()
        if self.first is None:
            self.first = (step, now)
        by_steps = step / self.total_steps if self.total_steps else 1.0
        by_time = train_s / self.budget_s if self.budget_s else 0.0
        left_steps = None
        if step > self.first[0]:
            left_steps = max(self.total_steps - step, 0) * (now - self.first[1]) / (step - self.first[0])
        elif step >= self.total_steps:
            left_steps = 0.0
        left_budget = max(self.budget_s - train_s, 0.0) if self.budget_s else None
        ends_by = "time budget" if left_budget is not None and (left_steps is None or left_budget < left_steps) \
            else "steps"
        eta = left_budget if ends_by == "time budget" else left_steps
        self.fields = {"total_steps": self.total_steps, "done_pct": round(100 * min(max(by_steps, by_time), 1.0), 1),
                       "eta_s": None if eta is None else round(eta, 1), "ends_by": ends_by}
        return self.fields

    def log_words(self) -> str:
        """'/200 (25.0%) eta 1m23s by steps': what the log line adds after the step number."""
        f = self.fields
        if not f:
            return ""
        return f"/{f['total_steps']} ({f['done_pct']:.1f}%) eta {format_eta(f['eta_s'])} by {f['ends_by']}"
