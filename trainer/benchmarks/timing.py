"""The timing loop the speed benchmarks share (train_step.py, target_forward.py, matmul_peak.py): each timed call
between two device synchronizations, so its time is the GPU's work and not the launch's."""

from __future__ import annotations

import time


def device_sync(device):
    """A function that waits for the device's queued work (nothing to wait for on the CPU)."""
    import torch
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


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
    times, out = [], None
    for i in range(warmup, warmup + steps):
        sync()
        t0 = time.perf_counter()
        out = fn(i)
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times), out, warm_s


def back_to_back_s(fn, calls: int, device) -> float:
    """Seconds per call of fn(0..calls-1) queued back to back, one synchronization before the first and after the
    last: the device busy without a pause, as through a deeper model's layers or a training run's forwards (a call
    timed alone, as timed_calls does, follows an idle moment)."""
    sync = device_sync(device)
    sync()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    sync()
    return (time.perf_counter() - t0) / calls
