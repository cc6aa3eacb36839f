"""metrics.jsonl (step metrics), profile.jsonl (time breakdown snapshots), telemetry.jsonl (NVML).

All three are append-only JSON lines in the run dir. Each row is one os.write on an O_APPEND descriptor: Linux
appends such a write whole, so the ranks of a torchrun job share one file without interleaving (rows carry "rank"),
and a tail -f or the lifecycle's status sees a row at once. telemetry.jsonl is only created when NVML answers (no
NVIDIA driver -> no file, and NvmlTelemetry.unavailable says why, for one log line).
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from collections import defaultdict


def read_jsonl(path) -> list[dict]:
    """The rows a JsonlWriter has written so far: [] before the file exists; a line still being written (no newline
    yet) or garbled by a write cut short (a full disk, see write) is left out. Drivers, benchmarks and tests read
    the run's JSON-lines files with it."""
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


class JsonlWriter:
    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, row: dict) -> None:
        data = (json.dumps(row) + "\n").encode()
        written = os.write(self._fd, data)
        if written != len(data):  # a full disk: the rest as a row of its own would be garbage
            raise OSError(f"{self.path}: wrote {written} of {len(data)} bytes")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def profile_line(row: dict) -> str:
    """The log's form of a profile row: seconds per phase, tokens/s, queue depth."""
    phases = " ".join(f"{k} {v:.2f}s" for k, v in sorted(row.get("seconds", {}).items()))
    extra = "".join(f" {k} {row[k]}" for k in ("tokens_per_s", "queue_depth") if row.get(k) is not None)
    who = f"rank {row['rank']} {row['role']} " if "rank" in row else ""
    return f"profile: {who}step {row.get('step')} {phases}{extra}"


class Profiler:
    """Wall-clock seconds per training phase, written to profile.jsonl (and the log) every `interval_s`.

    Times are host-side: on CUDA they include waiting for the GPU only where the loop syncs anyway
    (once per optimizer step), so the split between phases is approximate there."""

    def __init__(self, run_dir: str, interval_s: float, log=None):
        self.writer = JsonlWriter(os.path.join(run_dir, "profile.jsonl"))
        self.interval_s = interval_s
        self.log = log
        self.totals: dict[str, float] = defaultdict(float)
        self.tokens = 0
        self.last_row: dict | None = None
        self._last_write = time.time()
        self._start = time.time()

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] += seconds

    def maybe_write(self, step: int, force: bool = False) -> dict | None:
        """The row written, or None when it is not due."""
        now = time.time()
        if not force and now - self._last_write < self.interval_s:
            return None
        self._last_write = now
        row = {"time": now, "step": step, "elapsed_s": now - self._start,
               "seconds": {k: round(v, 4) for k, v in self.totals.items()},
               "tokens_per_s": round(self.tokens / max(now - self._start, 1e-9), 1),
               "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        try:
            import torch
            if torch.cuda.is_available():
                row["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
        except ImportError:
            pass
        self.writer.write(row)
        if self.log is not None:
            self.log(profile_line(row))
        self.last_row = row
        return row

    def close(self) -> None:
        self.writer.close()


class NvmlTelemetry:
    """GPU utilization, memory, power and temperature via nvidia-ml-py (the `nvml` extra), one row per GPU every
    `interval_s` into telemetry.jsonl, from a daemon thread (a long optimizer step does not delay the readings).
    Without the library or a driver it does nothing; `unavailable` then says why (the caller logs it once)."""

    def __init__(self, run_dir: str, interval_s: float, gpu_ids: list[int], rank: int | None = None):
        self.interval_s = interval_s
        self.rank = rank
        self.handles = []
        self.writer = None
        self.unavailable: str | None = None
        self.latest: dict[int, dict] = {}  # gpu -> its last row (Weights & Biases logs these)
        self._step = lambda: None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self.handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in (gpu_ids or range(count)) if i < count]
            self._nvml = pynvml
            if not self.handles:
                self.unavailable = f"NVML shows {count} GPUs, none of {gpu_ids}"
        except ImportError:
            self.unavailable = "nvidia-ml-py is not installed (pip install dflash_trainer[nvml])"
        except Exception as e:  # noqa: BLE001 - no driver (the CPU): telemetry is optional by contract
            self.unavailable = f"NVML did not start ({' '.join(str(e).split()) or type(e).__name__})"
        if self.handles:
            self.writer = JsonlWriter(os.path.join(run_dir, "telemetry.jsonl"))

    def read(self, step: int | None) -> list[dict]:
        """One reading of every GPU, written as rows; [] without NVML."""
        if self.writer is None:
            return []
        now, nv, rows = time.time(), self._nvml, []
        for index, h in self.handles:
            row = {"time": now, "step": step, "gpu": index}
            if self.rank is not None:
                row["rank"] = self.rank
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                row.update(util_pct=util.gpu, mem_used_mb=round(mem.used / 2**20, 1),
                           mem_total_mb=round(mem.total / 2**20, 1),
                           power_w=nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                           temp_c=nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
                self.latest[index] = row
            except Exception as e:  # noqa: BLE001 - one failed reading must not stop training
                row["error"] = str(e)
            self.writer.write(row)
            rows.append(row)
        return rows

    def start(self, step=lambda: None) -> "NvmlTelemetry":
        """Read every `interval_s` from a daemon thread; `step()` gives the step to stamp the rows with."""
        if self.writer is not None and self._thread is None:
            self._step = step
            self._thread = threading.Thread(target=self._loop, name="nvml", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            try:
                self.read(self._step())
            except OSError:  # a full disk must not kill training; the next reading retries
                pass
            if self._stop.wait(self.interval_s):
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.handles:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
