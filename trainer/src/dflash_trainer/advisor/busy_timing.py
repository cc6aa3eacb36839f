"""Timing with the device kept busy, as a training run keeps it (dflash-train --plan, and the speed benchmarks'
back-to-back figures): calls queued back to back between one synchronization before the first and one after the
last. A call timed alone follows an idle moment and runs at the boost clock; a device kept busy meets its power
limit. On one H100 on 2026-12-05 the SM clock fell from 1,980 MHz to 1,245-1,545 MHz at the 700 W limit within
0.2 s of back-to-back work: bf16 matrix products lost 11 % of their rate, the Qwen3.6-shaped target's forward 3-5 %
(trainer/results/target-forward-qwen3.6-27b-h100-2026-12-05-power*)."""

from __future__ import annotations

import math
import time

# Seconds of back-to-back work a busy figure is measured over: well past the ~0.2 s the power limit took to act,
# so most of the window runs at the clock a training run keeps.
SUSTAIN_S = 2.0


def device_sync(device):
    """A function that waits for the device's queued work (nothing to wait for on the CPU)."""
    import torch
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def each_call_s(fn, calls: int, device, first: int = 0) -> tuple[list[float], object]:
    """fn(first..first+calls-1), each call between two synchronizations: (its seconds per call, sorted; the last
    call's result)."""
    sync, times, out = device_sync(device), [], None
    for i in range(first, first + calls):
        sync()
        t0 = time.perf_counter()
        out = fn(i)
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times), out


def alone_s(fn, calls: int, device) -> float:
    """Median seconds of fn(0..calls-1), each call between two synchronizations: a call timed alone."""
    times, _ = each_call_s(fn, calls, device)
    return times[len(times) // 2]


def back_to_back_s(fn, calls: int, device) -> float:
    """Seconds per call of fn(0..calls-1) queued back to back, one synchronization before the first and after the
    last: the device busy without a pause, as through a deeper model's layers or a training run's steps."""
    sync = device_sync(device)
    sync()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    sync()
    return (time.perf_counter() - t0) / calls


def busy_calls(alone_s: float, at_least: int) -> int:
    """How many calls of alone_s seconds each fill SUSTAIN_S (at least `at_least`)."""
    return max(at_least, math.ceil(SUSTAIN_S / alone_s)) if alone_s > 0 else at_least
