# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What a run is doing, read inside the container (stdlib only): its live processes, the runs a launch must stop
first, and the status an operator sees (state phrase, heartbeat, ranks, GPU utilization and memory, log tail)."""

import json
import os
import time

from .gpu_release import nvml_snapshot
from .job_nodes import node_status
from .job_ranks import is_healthy, job_state, rank_states, ranks_dir, slowest_rank
from .plain_text import plain, plain_line
from .rank_ends import describe_rank, first_failure, retire_stale
from .procfs import cmdline, cmdline_matches, is_alive
from .run_report import run_report
from .run_records import EXIT_RECORD, LOG_NAME, STOP_RECORD, exit_text, own_record, read_json, read_pid

TELEMETRY_NAME = "telemetry.jsonl"  # the trainer's NVML rows (telemetry.py): {time, gpu, util_pct, mem_used_mb, ...}


def run_state(run_dir, pid, launch_info, first=None):
    """One phrase for the run as an operator asks about it: running, not running (why), crashed (how; `first`:
    the rank that failed first, named before anything it caused)."""
    state = _run_state(run_dir, pid, launch_info)
    if first and state.startswith("crashed ("):
        state = "crashed (%s; then %s" % (describe_rank(first), state[len("crashed ("):])
    return state


def _run_state(run_dir, pid, launch_info):
    if pid is not None:
        return "running"
    if launch_info is None:
        return "not running (never launched)"
    last = read_pid(run_dir)
    hb = own_heartbeat(run_dir)
    stop = own_record(run_dir, STOP_RECORD, last)
    ended = own_record(run_dir, EXIT_RECORD, last)
    step = (hb or {}).get("step")
    if hb and hb.get("phase") == "finished":
        by = hb.get("stopped") or (stop or {}).get("signal")
        if by:
            return "not running (stopped by %s at step %s, checkpointed)" % (by, step)
        return "not running (finished at step %s)" % step
    if stop:
        return "not running (stopped by %s after %ss at step %s, before the trainer checkpointed)" % (
            stop.get("signal"), stop.get("waited_s"), step if step is not None else "?")
    if ended:
        return "crashed (exit %s)" % exit_text(ended.get("rc"))
    if hb and hb.get("phase") == "failed":
        return "crashed (exit status not recorded; the trainer reported: %s)" % plain(hb.get("error", "no error text"))
    if hb:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(hb.get("updated_at", 0))))
        return ("crashed (exit status not recorded: the process is gone; last heartbeat: phase %s, step %s, %s)"
                % (hb.get("phase"), step, when))
    return "crashed (exit status not recorded: the process is gone before its first heartbeat)"


def own_heartbeat(run_dir):
    """The heartbeat written by the run's last launched process (its pid file), else None: a heartbeat left by an
    earlier launch says nothing about the current one."""
    return own_heartbeat_of(run_dir, read_pid(run_dir))


def own_heartbeat_of(run_dir, pid):
    hb = read_json(os.path.join(run_dir, "heartbeat.json"))
    return hb if hb is not None and pid is not None and hb.get("pid") == pid else None


def first_failed_rank(run_dir, launch_info, ranks=None):
    """The torchrun job's rank that failed first (rank_ends.first_failure), None for one process or none failed."""
    directory = ranks_dir(launch_info, run_dir)
    if directory is None:
        return None
    rows = rank_states(run_dir, launch_info) if ranks is None else ranks
    return first_failure(directory, rows, os.path.join(run_dir, LOG_NAME))


def retire_stale_ranks(run_dir, pid, launch_info, ranks):
    """Once the torchrun agent is gone, the pid files of gone ranks (or of pids another process has now) become
    end records (rank_ends.retire_stale); returns the ranks left registered."""
    directory = ranks_dir(launch_info, run_dir)
    if directory is None or pid is not None or all(r["alive"] for r in ranks):
        return ranks
    retire_stale(directory, ranks, os.path.join(run_dir, LOG_NAME))
    return rank_states(run_dir, launch_info)


def log_tail(path, lines):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [plain_line(line) for line in data.splitlines()[-lines:]]  # no emoji: Ansible prints it escaped


def gpu_utilization(run_dir, now):
    """The last NVML row of each GPU in the run's telemetry.jsonl (its tail only), by GPU, with its age; None
    when the trainer wrote none (no driver, or not yet)."""
    latest = {}
    for line in log_tail(os.path.join(run_dir, TELEMETRY_NAME), 512):
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a row cut by the tail's first byte
        if isinstance(row, dict) and "gpu" in row and "util_pct" in row:
            latest[row["gpu"]] = row
    if not latest:
        return None
    keys = ("gpu", "rank", "util_pct", "mem_used_mb", "mem_total_mb", "power_w", "temp_c")
    return [dict(((k, latest[g][k]) for k in keys if k in latest[g]),
                 age_s=round(now - float(latest[g].get("time", now)), 1)) for g in sorted(latest)]


def live_run(run_dir):
    """(pid, launch) when the run's recorded process is alive and is the program launched, else (None, launch)."""
    launch = read_json(os.path.join(run_dir, "launch.json"))
    pid = read_pid(run_dir)
    if launch is None or pid is None or not is_alive(pid):
        return None, launch
    if not cmdline_matches(cmdline(pid), launch.get("argv")):
        return None, launch  # the pid was reused by something else
    return pid, launch


def run_processes(run_dir):
    """(pid, launch, ranks, any_left): the launched process when alive and ours (a torchrun job's agent), the
    job's registered ranks ([] for one process), and whether anything of the run is left to stop (an agent, or
    ranks that outlived it)."""
    pid, launch_info = live_run(run_dir)
    ranks = rank_states(run_dir, launch_info)
    return pid, launch_info, ranks, pid is not None or any(r["alive"] for r in ranks)


def conflicting_runs(req):
    """Runs with processes left that must stop before req launches: the run itself, and any run sharing a GPU.
    Entries are (name, pid); pid is None where only ranks are left (their agent died)."""
    found = []
    own_pid, own_launch, _ranks, own_left = run_processes(req["run_dir"])
    if own_left:
        found.append((req["run"], own_pid))
    gpus = set(req.get("gpus") or [])
    root = req["runs_root"]
    try:
        names = sorted(os.listdir(root)) if gpus else []  # runs without GPUs never conflict
    except OSError:
        names = []
    for name in names:
        run_dir = os.path.join(root, name)
        if os.path.realpath(run_dir) == os.path.realpath(req["run_dir"]):
            continue
        pid, launch, _ranks, left = run_processes(run_dir)
        if left and gpus.intersection(launch.get("gpus") or []):
            found.append((name, pid))
    return found, own_pid, own_launch


def kernel_fields(hb):
    """Which linear-attention and conv code the target's layers run (dflash-train's `target kernels:` line, issue
    31), from the heartbeat; absent from heartbeats of older trainers."""
    return {"target_kernels": hb.get("target_kernels")}


def plan_fields(run_dir):
    """The layout advisor's verdict (`dflash-train --plan` writes plan.json into the run dir, issue 31): its warning
    when the configured split is predicted >= 15 % below the best, else None; no plan.json, no fields."""
    plan = read_json(os.path.join(run_dir, "plan.json"))
    if not isinstance(plan, dict):
        return {}
    return {"plan_warning": plan.get("warning"), "plan_predicted_seq_per_s": (plan.get("configured") or {}).get(
        "seq_per_s"), "plan_best_seq_per_s": (plan.get("best") or {}).get("seq_per_s")}


def run_progress(hb):
    """The trainer's step of total, share done and ETA (seconds of training left, by the steps or the time budget,
    whichever ends the run) from the heartbeat; None before the first step or from a trainer without them."""
    if hb.get("total_steps") is None:
        return None
    return {key: hb.get(key) for key in ("total_steps", "done_pct", "eta_s", "ends_by")}


def status(req):
    run_dir = req["run_dir"]
    pid, launch_info, ranks, _left = run_processes(run_dir)
    first = first_failed_rank(run_dir, launch_info, ranks) if not is_healthy(pid, ranks) else None
    ranks = retire_stale_ranks(run_dir, pid, launch_info, ranks)
    healthy = is_healthy(pid, ranks)
    hb = own_heartbeat(run_dir)
    now = time.time()
    out = {"run": req["run"], "run_dir": run_dir, "alive": healthy, "pid": pid,
           "launched": launch_info is not None, "fingerprint": (launch_info or {}).get("fingerprint"),
           "launched_at": (launch_info or {}).get("launched_at"), "heartbeat": hb,
           "state": job_state(pid, ranks) or run_state(run_dir, pid, launch_info, first),
           "ranks": ranks, "world": (launch_info or {}).get("job")}
    # the first failed rank of a job that failed (not of one stopped, whose ranks may have met SIGKILL at the end)
    out["failed_rank"] = first if out["state"].startswith(("crashed", "failing")) else None
    if hb:
        out["heartbeat_age_s"] = round(now - float(hb.get("updated_at", 0)), 1)
        for key in ("phase", "step", "epoch", "loss", "tokens_per_s", "queue_depth"):
            out[key] = hb.get(key)
        out["slowest_rank"] = slowest_rank(hb, now)
        out.update(kernel_fields(hb))
        out["progress"] = run_progress(hb)
        if not healthy and hb.get("phase") not in ("finished", "failed"):
            out["phase"] = "dead"
            out["dead_since"] = hb.get("updated_at")
    elif launch_info is not None:
        out["phase"] = "loading" if healthy else "dead"
    else:
        out["phase"] = "never launched"
    out.update(plan_fields(run_dir))
    out["gpu_utilization"] = gpu_utilization(run_dir, now)
    out["gpu_memory"] = None
    if not req.get("gpus"):
        out["gpu_memory_note"] = "no GPUs configured for this run"
    else:
        try:
            out["gpu_memory"] = nvml_snapshot(req["gpus"])
        except RuntimeError as exc:
            out["gpu_memory_note"] = str(exc)
    out["log_tail"] = log_tail(os.path.join(run_dir, LOG_NAME), req.get("status_log_lines", 0)) \
        if req.get("status_log_lines") else []
    if req.get("report"):
        out["report"] = run_report(run_dir, launch_info)
    return node_status(out, out["world"])
