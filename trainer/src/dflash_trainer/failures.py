"""Failures whose message already says everything in one line, and the one line of any other failure (stdlib
only: cli.py imports it before torch)."""

from __future__ import annotations

import os
import traceback

# Where a traceback passes when torch.compile raised: its compiler (dynamo, AOT autograd, inductor) or the code
# inductor generated (kept in its cache directory, torchinductor_<user>).
COMPILE_FRAMES = (os.path.join("torch", "_dynamo", ""), os.path.join("torch", "_inductor", ""),
                  os.path.join("torch", "_functorch", "_aot_autograd", ""), "torchinductor_")


class ExplainedFailure(Exception):
    """Ends the trainer with exit 1, the message as its one error line and in the heartbeat; no traceback,
    because the message names the path, the numbers and what to do."""


def failure_line(e: BaseException) -> str:
    """The error line of a failure that is not explained: its type and text on one line. When it was raised inside
    torch.compile (proof run 22: inductor's generated backward failed on a batch shape in the compile warm-up), the
    line says so and names the switch that keeps that part eager, since the data and flags are not at fault (for
    the drafter's layers, first the switch that keeps them compiled without the fusion that failed in run 22)."""
    line = " ".join(f"{type(e).__name__}: {e}".split())
    frames = [frame.filename for frame in traceback.extract_tb(e.__traceback__)]
    if type(e).__name__ == "OutOfMemoryError" or not any(m in f for f in frames for m in COMPILE_FRAMES):
        return line
    if any(f.endswith(os.path.join("dflash_trainer", "model", "target.py")) for f in frames):
        switch = "DFLASH_EAGER_TARGET=1 (the target's layers eager)"
    else:
        switch = "DFLASH_EAGER_LAYERS=1 (the drafter's layers eager), and DFLASH_EAGER_HEAD_LOSS=1 if it persists"
        # Run 22's failure was in inductor's generated backward of a mix-order reduction (the norms' backward
        # fused); with that fusion off the same flags ran compiled (proof run 23). So it is named before the eager
        # switches, which cost speed; the target has no backward, so its branch does not name it.
        if os.environ.get("TORCHINDUCTOR_MIX_ORDER_REDUCTION") != "0":
            switch = ("TORCHINDUCTOR_MIX_ORDER_REDUCTION=0 (that fusion of the norms' backward off, the layers still "
                      f"compiled), else with {switch}")
    return (f"{line} (raised inside torch.compile: a torch error, not the run's data or flags; "
            f"rerun with {switch}: slower steps, the same training)")
