"""metrics.jsonl (step metrics), profile.jsonl (time breakdown snapshots), telemetry.jsonl (NVML).

All three are append-only JSON lines in the run dir, flushed per line so a tail -f or the launcher sees
them at once. telemetry.jsonl is only created when NVML answers (no NVIDIA driver -> no file).
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import defaultdict


class JsonlWriter:
    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "a", buffering=1)

    def write(self, row: dict) -> None:
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class Profiler:
    """Wall-clock seconds per training phase, written to profile.jsonl every `interval_s`.

    Times are host-side: on CUDA they include waiting for the GPU only where the loop syncs anyway
    (once per optimizer step), so the split between phases is approximate there."""

    def __init__(self, run_dir: str, interval_s: float):
        self.writer = JsonlWriter(os.path.join(run_dir, "profile.jsonl"))
        self.interval_s = interval_s
        self.totals: dict[str, float] = defaultdict(float)
        self._last_write = time.time()
        self._start = time.time()

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] += seconds

    def maybe_write(self, step: int, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_write < self.interval_s:
            return
        self._last_write = now
        row = {"time": now, "step": step, "elapsed_s": now - self._start,
               "seconds": {k: round(v, 4) for k, v in self.totals.items()},
               "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        try:
            import torch
            if torch.cuda.is_available():
                row["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
        except ImportError:
            pass
        self.writer.write(row)


class NvmlTelemetry:
    """GPU utilization/memory/power via nvidia-ml-py, when a driver is present; otherwise a no-op."""

    def __init__(self, run_dir: str, interval_s: float, gpu_ids: list[int]):
        self.interval_s = interval_s
        self.handles = []
        self.writer = None
        self._last = 0.0
        try:
            import pynvml
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self.handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in (gpu_ids or range(count)) if i < count]
            self._nvml = pynvml
        except Exception:  # no library, no driver: telemetry is optional by contract
            self.handles = []
        if self.handles:
            self.writer = JsonlWriter(os.path.join(run_dir, "telemetry.jsonl"))

    def maybe_write(self, step: int) -> None:
        if self.writer is None or time.time() - self._last < self.interval_s:
            return
        self._last = time.time()
        nv = self._nvml
        for index, h in self.handles:
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                row = {"time": self._last, "step": step, "gpu": index, "util_pct": util.gpu,
                       "mem_used_mb": mem.used / 2**20, "mem_total_mb": mem.total / 2**20,
                       "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                       "temp_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)}
            except Exception as e:  # one failed reading must not stop training
                row = {"time": self._last, "step": step, "gpu": index, "error": str(e)}
            self.writer.write(row)
