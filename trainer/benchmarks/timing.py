"""The timing loop the speed benchmarks share (train_step.py, target_forward.py, matmul_peak.py): each timed call
between two device synchronizations, so its time is the GPU's work and not the launch's."""

from __future__ import annotations

import time

# one implementation with the product (dflash-train --plan times its stages back to back the same way)
from dflash_trainer.advisor.busy_timing import back_to_back_s, device_sync, each_call_s  # noqa: F401 (re-exported)


def timed_calls(fn, warmup: int, steps: int, device):
    """fn(0..warmup-1) untimed (compilation, allocator), then fn(warmup..warmup+steps-1) each timed; CUDA's peak
    memory counter restarts after the warm-up. Returns (seconds per timed call, sorted; the last call's result;
    the warm-up's seconds)."""
    import torch
    sync = device_sync(device)
    t_warm = time.perf_counter()
    for i in range(warmup):
        fn(i)
    sync()
    warm_s = time.perf_counter() - t_warm
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, out = each_call_s(fn, steps, device, first=warmup)
    return times, out, warm_s
