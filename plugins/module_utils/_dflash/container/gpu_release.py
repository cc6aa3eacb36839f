# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Wait until a run's GPUs are free: no process holds their device files, NVML reports memory released.

Inside an LXC container NVML lists no processes (the driver does not see PID namespaces), so used memory
is the signal there; the device-file scan finds holders that live in the same container. Without an
NVIDIA driver (the CPU default) the NVML part is skipped and the result says so instead of pretending.
Part of the package shipped into the container (stdlib only; see controller/lifecycle_shipping.py).
"""

import os
import time

from .procfs import cmdline, holders_of


def _started_nvml():
    """pynvml after nvmlInit() (the caller shuts it down), or RuntimeError(reason) when NVML is unusable."""
    try:
        import pynvml
    except ImportError:
        raise RuntimeError("nvidia-ml-py (pynvml) is not installed in the container")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        raise RuntimeError("NVML could not start (%s): no NVIDIA driver here" % exc)
    return pynvml


def nvml_snapshot(indexes):
    """{index: {"used_mib", "processes": [pids]}} or raise RuntimeError(reason) when NVML is unusable."""
    pynvml = _started_nvml()
    try:
        count = pynvml.nvmlDeviceGetCount()
        out = {}
        for index in indexes:
            if index >= count:
                raise RuntimeError("GPU %d does not exist: NVML sees %d GPUs" % (index, count))
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            used = pynvml.nvmlDeviceGetMemoryInfo(handle).used // (1024 * 1024)
            procs = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            out[index] = {"used_mib": int(used), "processes": procs}
        return out
    finally:
        pynvml.nvmlShutdown()


def check_gpus_exist(gpus, device_pattern=None):
    """Refuse (before anything is stopped) GPU indexes NVML does not know; when NVML is unusable, indexes whose
    device file (device_pattern, e.g. /dev/nvidia{index}) does not exist. Without either there is nothing to check."""
    if not gpus:
        return
    try:
        pynvml = _started_nvml()
    except RuntimeError as exc:
        if device_pattern is None:
            return
        missing = [g for g in gpus if not os.path.exists(device_pattern.format(index=g))]
        if missing:
            raise ValueError("GPU %s does not exist here: no device file %s, and NVML is unusable (%s); fix the "
                             "run's GPU lists (dflash_target_gpus / dflash_drafter_gpus), or the driver"
                             % (",".join(str(g) for g in missing),
                                ", ".join(device_pattern.format(index=g) for g in missing), exc))
        return
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    missing = [g for g in gpus if g >= count]
    if missing:
        names = ",".join(str(g) for g in missing)
        raise ValueError("GPU %s does not exist here: NVML sees %d GPUs (0-%d); fix the run's GPU lists "
                         "(dflash_target_gpus / dflash_drafter_gpus)" % (names, count, count - 1))


def _busy(snapshot, threshold_mib):
    return dict((i, s) for i, s in snapshot.items() if s["used_mib"] >= threshold_mib or s["processes"])


def wait_for_release(gpus, device_pattern, threshold_mib, timeout_s, poll_s=0.25):
    """Block until the GPUs are free or fail with RuntimeError naming what still holds them."""
    result = {"gpus": list(gpus), "skipped": False, "reason": None, "nvml": None, "waited_s": 0.0}
    if not gpus:
        result.update(skipped=True, reason="no GPUs configured for this run")
        return result
    start = time.monotonic()
    paths = [device_pattern.format(index=i) for i in gpus]
    nvml_reason = None
    while True:
        holders = holders_of(paths)
        busy = {}
        if nvml_reason is None:
            try:
                busy = _busy(nvml_snapshot(gpus), threshold_mib)
                result["nvml"] = "used"
            except RuntimeError as exc:
                nvml_reason = str(exc)
        if not holders and not busy:
            break
        if time.monotonic() - start >= timeout_s:
            raise RuntimeError(_timeout_message(gpus, holders, busy, timeout_s))
        time.sleep(poll_s)
    result["waited_s"] = round(time.monotonic() - start, 3)
    if nvml_reason is not None:
        result.update(skipped=True, nvml="unavailable",
                      reason="GPU memory wait skipped: %s (device files were checked)" % nvml_reason)
    return result


def _timeout_message(gpus, holders, busy, timeout_s):
    parts = []
    for pid, paths in sorted(holders.items()):
        parts.append("pid %d (%s) holds %s" % (pid, " ".join(cmdline(pid) or ["?"])[:120], ", ".join(paths)))
    for index, s in sorted(busy.items()):
        parts.append("GPU %d has %d MiB in use%s" % (
            index, s["used_mib"], " by pids %s" % s["processes"] if s["processes"] else ""))
    return ("GPUs %s were not released within %ss: %s; stop that process (or raise gpu_release_timeout), "
            "then run this again" % (",".join(str(g) for g in gpus), timeout_s, "; ".join(parts)))
