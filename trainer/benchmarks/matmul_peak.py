"""The hardware peak the benchmarks divide by, measured in the benchmark's own process (issue 15): the best of
ten n^3 matrix products, so clocks, power cap and library versions are those of the run it is compared with.
Shared by train_step.py, target_forward.py and pipeline.py (torch is imported here only when called)."""

from __future__ import annotations

import math
import sys
import time

from .timing import back_to_back_s, device_sync


def square_operands(device, n: int):
    """(a, b, dtype): two random n x n matrices, bf16 on CUDA, fp32 on the CPU (the dtype the CPU path trains in)."""
    import torch
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return (torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype), dtype)


def measure_peak(device, n: int) -> dict:
    """Best of ten n^3 matrix products (bf16 on CUDA; fp32 on the CPU, the dtype the CPU path trains in)."""
    import torch
    a, b, dtype = square_operands(device, n)
    sync = device_sync(device)
    for _ in range(3):
        a @ b
    sync()
    best = math.inf
    for _ in range(10):
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    del a, b
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"tflops": 2 * n ** 3 / best / 1e12, "n": n, "dtype": str(dtype).replace("torch.", ""),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}


def measure_sustained_peak(device, n: int, calls: int) -> dict:
    """`calls` n^3 matrix products back to back (timing.back_to_back_s): the rate with the device busy for as long as
    the work it is compared with, where a power cap or heat may lower the clocks that a product timed alone keeps."""
    a, b, dtype = square_operands(device, n)
    a @ b
    s = back_to_back_s(lambda _i: a @ b, calls, device)
    del a, b
    return {"tflops": 2 * n ** 3 / s / 1e12, "n": n, "calls": calls, "dtype": str(dtype).replace("torch.", "")}


def describe(peak: dict) -> str:
    return (f"{peak['tflops']:.4g} TFLOP/s, best of ten {peak['n']}^3 {peak['dtype']} matrix products on "
            f"{peak['device']} in this process")


# n of the measurement per device type: 8192 on the GPU (issue 15); on the CPU a size that takes a moment
PEAK_N = {"cuda": 8192, "cpu": 512}


def benchmark_device(requested: str, prog: str, hint: str):
    """The device `--device` names (auto: CUDA where there is one). Asked for CUDA without it: one line on stderr
    naming `hint`, and exit status 2."""
    import torch
    device = torch.device(requested if requested != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"{prog}: error: --device cuda but CUDA is not available; {hint}", file=sys.stderr)
        raise SystemExit(2)
    return device
