"""Why this process was launched, once per (re)start: a row in <run-dir>/events.jsonl, a log line and, with W&B, an
event in the one W&B run of the training run (wandb_log.py), so a chart shows where each restart begins.

The collection passes the reason in DFLASH_LAUNCH_REASON (roles/training's launch: first launch, config change,
force, crash, relaunch); a dflash-train started by hand has none and says `by hand`.
"""

from __future__ import annotations

import os
import time

from dflash_trainer.telemetry.writers import JsonlWriter

REASON_ENV = "DFLASH_LAUNCH_REASON"
EVENTS_FILE = "events.jsonl"


def launch_reason() -> str:
    return os.environ.get(REASON_ENV, "").strip()[:100] or "by hand"


def record_launch(run_dir: str, step: int, say, wandb_run=None) -> dict:
    """The launch row ({event: start|restart, reason, step, time}); `step`: the step resumed from (0: a fresh run)."""
    row = {"event": "restart" if step > 0 else "start", "reason": launch_reason(), "step": step, "time": time.time()}
    writer = JsonlWriter(os.path.join(run_dir, EVENTS_FILE))
    try:
        writer.write(row)
    finally:
        writer.close()
    say(f"{row['event']} at step {step}: {row['reason']}")
    if wandb_run is not None:  # with this process's first step: a resumed W&B run drops steps it has logged
        wandb_run.event(step + 1, row["event"], row["reason"])
    return row
