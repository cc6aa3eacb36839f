# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The run lifecycle, executed INSIDE the training container: JSON request in, JSON result out.

One transport call ships this package (controller/lifecycle_shipping.py) and calls main(), so that a restart
costs one `pct exec`, and the same code is what local mode and the container tests exercise. Stdlib only.

Run directory contract (DESIGN.md): launch.json, pid, train.log, heartbeat.json, checkpoints/, metrics.jsonl,
telemetry.jsonl.
"""

import errno
import json
import os
import re
import signal
import subprocess
import time

from .entry import answer
from .file_lock import FileLock
from .gpu_release import check_gpus_exist, nvml_snapshot, wait_for_release
from .job_ranks import clear_rank_files, is_healthy, job_state, rank_states, slowest_rank, stop_job
from .procfs import POLL_S, cmdline, cmdline_matches, is_alive, stop_group
from .run_name import validate_run_name
from .run_paths import check_not_system_dir, check_reserved_env
from .run_space import check_space, checkpoints_dir, last_checkpoint
from .trainer_record import TrainerRefused, check_trainer

LOCK_NAME = ".dflash-lifecycle.lock"
LOG_NAME = "train.log"
TELEMETRY_NAME = "telemetry.jsonl"  # the trainer's NVML rows (telemetry.py): {time, gpu, util_pct, mem_used_mb, ...}
LAUNCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # unless the run's env sets PATH


class LifecycleError(Exception):
    """A refusal or failure to report as failed=true with this one-line message (plus extra facts)."""

    def __init__(self, msg, **facts):
        Exception.__init__(self, msg)
        self.facts = facts


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json_atomic(path, data):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _unlink(tmp)  # never a temp file left behind (a full disk fails the write, or the fsync)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = path  # a failed write or flush names no file by itself
        raise


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _read_pid(run_dir):
    try:
        with open(os.path.join(run_dir, "pid")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


EXIT_RECORD = "exit.json"  # {pid, rc}: written when the lifecycle saw the launched process exit (verify)
STOP_RECORD = "stopped.json"  # {pid, signal, waited_s, at}: written when the lifecycle stopped the run's process


def _own_record(run_dir, name, pid):
    rec = _read_json(os.path.join(run_dir, name))
    return rec if isinstance(rec, dict) and pid is not None and rec.get("pid") == pid else None


def _record(run_dir, name, data):
    """Best effort: a record that cannot be written (full disk) must not turn a done stop into a failure."""
    try:
        _write_json_atomic(os.path.join(run_dir, name), data)
    except OSError:
        pass  # _write_json_atomic removed its temp file


def _exit_text(rc):
    if rc is None:
        return "status unknown"
    if rc < 0:
        try:
            return "killed by %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return str(rc)


def run_state(run_dir, pid, launch_info):
    """One phrase for the run as an operator asks about it: running, not running (why), crashed (how)."""
    if pid is not None:
        return "running"
    if launch_info is None:
        return "not running (never launched)"
    last = _read_pid(run_dir)
    hb = own_heartbeat(run_dir)
    stop = _own_record(run_dir, STOP_RECORD, last)
    ended = _own_record(run_dir, EXIT_RECORD, last)
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
        return "crashed (exit %s)" % _exit_text(ended.get("rc"))
    if hb and hb.get("phase") == "failed":
        return "crashed (exit status not recorded; the trainer reported: %s)" % hb.get("error", "no error text")
    if hb:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(hb.get("updated_at", 0))))
        return ("crashed (exit status not recorded: the process is gone; last heartbeat: phase %s, step %s, %s)"
                % (hb.get("phase"), step, when))
    return "crashed (exit status not recorded: the process is gone before its first heartbeat)"


def own_heartbeat(run_dir):
    """The heartbeat written by the run's last launched process (its pid file), else None: a heartbeat left by an
    earlier launch says nothing about the current one."""
    hb = _read_json(os.path.join(run_dir, "heartbeat.json"))
    pid = _read_pid(run_dir)
    return hb if hb is not None and pid is not None and hb.get("pid") == pid else None


def log_tail(path, lines):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return data.splitlines()[-lines:]


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
    launch = _read_json(os.path.join(run_dir, "launch.json"))
    pid = _read_pid(run_dir)
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


def lifecycle_lock(root, timeout_s):
    """One lifecycle operation per container (runs root) at a time."""
    return FileLock(os.path.join(root, LOCK_NAME), timeout_s, lambda path, t: LifecycleError(
        "another restart/stop of this container held %s for %ss; wait for it to finish (or raise lock_timeout)"
        % (path, t)), poll_s=POLL_S)


def _unique_path(path):
    """path, or path with .N before its extension (train.<stamp>.1.log): kept files still match train.*.log."""
    if not os.path.exists(path):
        return path
    base, ext = os.path.splitext(path)
    n = 1
    while os.path.exists("%s.%d%s" % (base, n, ext)):
        n += 1
    return "%s.%d%s" % (base, n, ext)


def _keep_previous(run_dir, now):
    """Move the previous launch's log and launch.json aside, never overwriting anything."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    kept = []
    for name, ext in ((LOG_NAME, ".log"), ("launch.json", ".json")):
        path = os.path.join(run_dir, name)
        if os.path.exists(path):
            dest = _unique_path(os.path.join(run_dir, "%s.%s%s" % (name[: -len(ext)], stamp, ext)))
            os.rename(path, dest)
            kept.append(dest)
    return kept


RECORD_RE = {"train": re.compile(r"train\.(\d{8}-\d{6})(?:\.(\d+))?\.log"),
             "launch": re.compile(r"launch\.(\d{8}-\d{6})(?:\.(\d+))?\.json")}


def prune_records(run_dir, keep):
    """Remove all but the newest `keep` of train.<stamp>[.N].log and of launch.<stamp>[.N].json (each kind on its
    own); only names _keep_previous makes are touched, never a checkpoint. Returns the removed paths."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    removed = []
    for pattern in RECORD_RE.values():
        found = []
        for name in names:
            m = pattern.fullmatch(name)
            if m:
                found.append(((m.group(1), int(m.group(2) or 0)), name))
        for _key, name in sorted(found, reverse=True)[keep:]:
            path = os.path.join(run_dir, name)
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


def _write_pidfile(run_dir):
    # Runs in the child after setsid(), before exec: the pid on disk is the new group leader's.
    path = os.path.join(run_dir, "pid")
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, ("%d\n" % os.getpid()).encode())
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, path)


def _launch_path(req):
    return str((req.get("env") or {}).get("PATH", LAUNCH_PATH))


def _restore(kept, run_dir):
    """Undo _keep_previous when the new launch could not even start: the previous launch stays the record."""
    _unlink(os.path.join(run_dir, "launch.json"))  # this launch never happened
    for path in kept:
        name = "launch.json" if os.path.basename(path).startswith("launch.") else LOG_NAME
        try:
            os.rename(path, os.path.join(run_dir, name))
        except OSError:
            pass


def launch(req, now):
    run_dir = req["run_dir"]
    kept = _keep_previous(run_dir, now)
    prune_records(run_dir, req["keep_records"])
    public = {
        "run": req["run"], "argv": req["argv"], "env": req.get("env") or {},
        "secret_env_names": sorted((req.get("secret_env") or {}).keys()), "gpus": req.get("gpus") or [],
        "cwd": req.get("cwd"), "fingerprint": req["fingerprint"], "launched_at": now, "log": LOG_NAME,
        "checkpoints": checkpoints_dir(req["argv"], run_dir),
        # torchrun: world layout and where the ranks register; run_dir = the DFLASH_RUN_DIR every rank inherits
        "job": dict(req["job"], run_dir=run_dir) if req.get("job") else None,
    }
    env = {"PATH": LAUNCH_PATH}
    env.update(dict((k, str(v)) for k, v in (req.get("env") or {}).items()))
    env.update(dict((k, str(v)) for k, v in (req.get("secret_env") or {}).items()))
    env.update(DFLASH_RUN_DIR=run_dir, DFLASH_RUN_NAME=req["run"])
    log_path = os.path.join(run_dir, LOG_NAME)
    if public["job"]:
        clear_rank_files(public["job"]["ranks_dir"])  # the previous job is stopped: its leftover files say nothing
    try:
        _write_json_atomic(os.path.join(run_dir, "launch.json"), public)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    except OSError as exc:
        _restore(kept, run_dir)
        raise LifecycleError(_os_text(exc))
    try:
        proc = subprocess.Popen(
            req["argv"], stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
            # New session: no controlling terminal, so the terminal's hangup when `pct exec -tt`
            # or the SSH session ends cannot reach it. close_fds: our stdout pipe must not leak.
            start_new_session=True, close_fds=True, env=env, cwd=req.get("cwd") or run_dir,
            preexec_fn=lambda: _write_pidfile(run_dir),
        )
    except subprocess.SubprocessError as exc:  # the pid file could not be written in the child (a full disk)
        _unlink(os.path.join(run_dir, "pid.tmp"))
        _unlink(log_path)
        _restore(kept, run_dir)
        raise LifecycleError("could not write %s before the trainer started (%s); is the disk full?"
                             % (os.path.join(run_dir, "pid"), exc))
    except OSError as exc:
        os.write(log_fd, ("dflash.ops: could not execute %s: %s\n" % (req["argv"][0], exc)).encode())
        raise LifecycleError("the trainer could not be started: %s: %s; check command (is the trainer installed "
                             "in the container?)" % (req["argv"][0], exc.strerror or exc),
                             rc=127 if exc.errno == errno.ENOENT else 126,
                             log_tail=log_tail(log_path, req["log_tail_lines"]), kept=kept)
    finally:
        os.close(log_fd)
    return proc, kept


def verify(req, proc, timings):
    """Assert the launch is live: alive after settle_time, cmdline ours, heartbeat written by that pid.

    Records timings["first_heartbeat"]: seconds from launch to the new pid's first heartbeat (the trainer's
    own start-up cost, which benchmarks subtract from the restart time).
    """
    run_dir = req["run_dir"]
    hb_path = os.path.join(run_dir, "heartbeat.json")
    log_path = os.path.join(run_dir, LOG_NAME)
    start = time.monotonic()
    want = req.get("wait_for_phase")
    hb = first_hb = None

    def died(rc):
        _record(run_dir, EXIT_RECORD, {"pid": proc.pid, "rc": rc, "at": time.time()})
        return LifecycleError("the trainer exited with status %s right after launch; see log_tail (%s)"
                              % (rc, log_path), rc=rc, pid=proc.pid,
                              log_tail=log_tail(log_path, req["log_tail_lines"]), heartbeat=_read_json(hb_path))

    while True:
        rc = proc.poll()
        if rc is not None:
            raise died(rc)
        elapsed = time.monotonic() - start
        hb = _read_json(hb_path)
        fresh = hb is not None and hb.get("pid") == proc.pid
        if fresh and first_hb is None:
            first_hb = round(elapsed, 3)
            timings["first_heartbeat"] = first_hb
        if fresh and hb.get("phase") == "failed":
            proc_rc = _wait_exit(proc, 5)
            raise LifecycleError("the trainer reported phase failed: %s" % hb.get("error", "no error text"),
                                 rc=proc_rc, pid=proc.pid, heartbeat=hb,
                                 log_tail=log_tail(log_path, req["log_tail_lines"]))
        if elapsed >= req["settle_time"] and fresh:
            if not cmdline_matches(cmdline(proc.pid), req["argv"]):
                raise LifecycleError("pid %d does not run the launched command (%s)" % (
                    proc.pid, " ".join(cmdline(proc.pid) or [])), pid=proc.pid)
            # a finished job's ranks removed their pid files: nothing left to count
            ranks_up = _job_ranks_up(req, proc, log_path) if req.get("job") and hb.get("phase") != "finished" else True
            if ranks_up is None and elapsed >= req["settle_time"] + req["heartbeat_timeout"]:
                raise LifecycleError("the torchrun agent (pid %d) is alive but not all %d ranks wrote their pid file "
                                     "within %ss; see log_tail" % (proc.pid, req["job"]["nproc_per_node"],
                                                                   req["heartbeat_timeout"]),
                                     pid=proc.pid, log_tail=log_tail(log_path, req["log_tail_lines"]))
            if ranks_up is not None and (not want or hb.get("phase") in (want, "finished")):
                return hb
            if elapsed >= req["settle_time"] + req["phase_timeout"]:
                raise LifecycleError("the trainer is alive but did not reach phase %s within %ss (phase %s); "
                                     "see log_tail" % (want, req["phase_timeout"], hb.get("phase")),
                                     pid=proc.pid, heartbeat=hb, log_tail=log_tail(log_path, req["log_tail_lines"]))
        elif elapsed >= req["settle_time"] + req["heartbeat_timeout"]:
            raise LifecycleError("pid %d is alive but wrote no heartbeat to %s within %ss; is the command a "
                                 "dflash trainer? (raise heartbeat_timeout if loading is slow)"
                                 % (proc.pid, hb_path, req["heartbeat_timeout"]), pid=proc.pid,
                                 log_tail=log_tail(log_path, req["log_tail_lines"]))
        time.sleep(POLL_S)


def _job_ranks_up(req, proc, log_path):
    """The torchrun job's ranks once all of them registered, alive; None while some have not registered yet."""
    ranks = rank_states(req["run_dir"], _read_json(os.path.join(req["run_dir"], "launch.json")))
    dead = [r for r in ranks if not r["alive"]]
    if dead:
        raise LifecycleError("rank %d (pid %d) of the torchrun job died right after launch; see log_tail"
                             % (dead[0]["rank"], dead[0]["pid"]), pid=proc.pid, ranks=ranks,
                             log_tail=log_tail(log_path, req["log_tail_lines"]))
    return ranks if len(ranks) >= req["job"]["nproc_per_node"] else None


def _wait_exit(proc, timeout):
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def status(req):
    run_dir = req["run_dir"]
    pid, launch_info, ranks, _left = run_processes(run_dir)
    healthy = is_healthy(pid, ranks)
    hb = own_heartbeat(run_dir)
    now = time.time()
    out = {"run": req["run"], "run_dir": run_dir, "alive": healthy, "pid": pid,
           "launched": launch_info is not None, "fingerprint": (launch_info or {}).get("fingerprint"),
           "launched_at": (launch_info or {}).get("launched_at"), "heartbeat": hb,
           "state": job_state(pid, ranks) or run_state(run_dir, pid, launch_info),
           "ranks": ranks, "world": (launch_info or {}).get("job")}
    if hb:
        out["heartbeat_age_s"] = round(now - float(hb.get("updated_at", 0)), 1)
        for key in ("phase", "step", "epoch", "loss", "tokens_per_s", "queue_depth"):
            out[key] = hb.get(key)
        out["slowest_rank"] = slowest_rank(hb, now)
        if not healthy and hb.get("phase") not in ("finished", "failed"):
            out["phase"] = "dead"
            out["dead_since"] = hb.get("updated_at")
    elif launch_info is not None:
        out["phase"] = "loading" if healthy else "dead"
    else:
        out["phase"] = "never launched"
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
    return out


def _timed(timings, name, fn, *args):
    t0 = time.monotonic()
    try:
        return fn(*args)
    finally:
        timings[name] = round(time.monotonic() - t0, 3)


def stop_run(run_dir, pid, timeout):
    """Stop what is left of a run: its process group, or for a torchrun job every rank and then the agent."""
    launch_info = _read_json(os.path.join(run_dir, "launch.json"))
    if (launch_info or {}).get("job"):
        return stop_job(pid, run_dir, launch_info, timeout)
    return stop_group(pid, timeout)


def _stop_all(req, runs):
    stopped = []
    for name, pid in runs:
        run_dir = _run_dir_of(req, name)
        info = stop_run(run_dir, pid, req["stop_timeout"])
        pid = pid if pid is not None else _read_pid(run_dir)  # the agent's pid, also when it died before
        info.update(run=name, pid=pid)
        stopped.append(info)
        _record(run_dir, STOP_RECORD, {"pid": pid, "signal": info["signal"], "waited_s": info["waited_s"],
                                       "at": time.time()})
    return stopped


def _config_view(launch_info):
    """The parts of a launch that define the run (what a restart changes), for --diff."""
    keys = ("fingerprint", "argv", "env", "secret_env_names", "gpus", "cwd")
    return dict((key, (launch_info or {}).get(key)) for key in keys)


def run_diff(req, runs, own_pid, own_launch, same):
    """Ansible's before/after of this request: the run's configuration, and which runs are alive on its GPUs."""
    alive = [name for name, _pid in runs]
    before = {"alive": own_pid is not None, "alive_on_its_gpus": alive}
    before.update(_config_view(own_launch if own_pid is not None else None))
    if req["action"] == "stopped":
        after = dict(before, alive=False, alive_on_its_gpus=[n for n in alive if n != req["run"]])
        if req["run"] not in alive:
            after = before
    elif own_pid is not None and (req["action"] == "started" or (same and not req.get("force"))):
        after = before  # no-op: nothing changes
    else:
        after = {"alive": True, "alive_on_its_gpus": [req["run"]]}
        after.update(_config_view(dict(req, secret_env_names=sorted((req.get("secret_env") or {}).keys()))))
    label = "run %s" % req["run"]
    return {"before": before, "after": after, "before_header": label, "after_header": label}


def _stopped_after_failed_verify(req, proc, exc):
    """A launch that failed its proof must not live on as an unverified run: stop it, and say so."""
    if proc.poll() is not None:
        return exc
    info = stop_run(req["run_dir"], proc.pid, req["stop_timeout"])
    return LifecycleError("%s; the new process (pid %d) was stopped with %s" % (exc, proc.pid, info.get("signal")),
                          **exc.facts)


def change(req):
    """started / restarted / stopped, under the container's lock."""
    timings = {}
    try:
        return _change(req, timings)
    except LifecycleError as exc:
        exc.facts.setdefault("timings", timings)
        raise


class _NoLock(object):
    """Check mode reads state without the lock: taking it would create the runs root and the lock file."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _change(req, timings):
    action, check = req["action"], req.get("check_mode", False)
    # Again here, on the real paths (a link to / or /etc is refused too), before anything is created.
    check_not_system_dir(req["runs_root"], "runs_root", real=True)
    check_not_system_dir(req["run_dir"], "run_dir", real=True)
    check_reserved_env(req.get("env"), req.get("secret_env"))
    if not check:
        os.makedirs(req["runs_root"], exist_ok=True)
    result = {"run": req["run"], "run_dir": req["run_dir"], "changed": False, "timings": timings,
              "log_path": os.path.join(req["run_dir"], LOG_NAME), "stopped": [], "kept": []}
    t_lock = time.monotonic()
    with _NoLock() if check else lifecycle_lock(req["runs_root"], req["lock_timeout"]):
        timings["lock"] = round(time.monotonic() - t_lock, 3)
        runs, agent_pid, own_launch = conflicting_runs(req)
        # A torchrun job that lost a rank is not alive: it is replaced (what is left of it is stopped first).
        own_pid = agent_pid if is_healthy(agent_pid, rank_states(req["run_dir"], own_launch)) else None
        own_hb = own_heartbeat(req["run_dir"]) if own_pid is not None else None
        # Same configuration AND proven live by its own heartbeat; an unverified process is replaced.
        same = own_hb is not None and (own_launch or {}).get("fingerprint") == req.get("fingerprint")
        if req.get("diff"):
            result["diff"] = run_diff(req, runs, own_pid, own_launch, same)
        if action == "stopped":
            own = [(n, p) for n, p in runs if n == req["run"]]
            result.update(changed=bool(own), action="stopped" if own else "none", pid=agent_pid)
            if own and not check:
                result["stopped"] = _timed(timings, "stop", _stop_all, req, own)
            if not own:
                result["state"] = run_state(req["run_dir"], None, own_launch)
            return result
        if own_pid is not None and (action == "started" or (same and not req.get("force"))):
            result.update(action="noop", pid=own_pid, fingerprint=(own_launch or {}).get("fingerprint"),
                          same_config=same, heartbeat=own_hb)
            return result
        try:
            # Before anything is stopped: a launch that cannot start must not cost the running run.
            check_trainer(req["argv"], _launch_path(req), req.get("cwd") or req["run_dir"],
                          req.get("expect_trainer_version"))
            check_gpus_exist(req.get("gpus") or [], req["gpu_device_pattern"])
            check_space(req["argv"], req["run_dir"])
        except TrainerRefused as exc:
            raise LifecycleError(str(exc), rc=exc.rc)
        except ValueError as exc:
            raise LifecycleError(str(exc))
        result.update(changed=True, action="launched", would_stop=[name for name, _pid in runs])
        if check:
            return result
        result["stopped"] = _timed(timings, "stop", _stop_all, req, runs)
        # Where each stopped run left its work, read before launch() moves this run's launch.json aside.
        stopped_note = _stopped_note(req, result["stopped"])
        try:
            _launch_after_stop(req, result, timings)
        except LifecycleError as exc:
            raise _after_stop(exc, result["stopped"], stopped_note)
        except OSError as exc:  # a full disk, a read-only mount: name the path, never a bare errno
            raise _after_stop(LifecycleError(_os_text(exc)), result["stopped"], stopped_note)
    result["phase"] = result["heartbeat"].get("phase")
    return result


def _launch_after_stop(req, result, timings):
    try:
        result["gpu_wait"] = _timed(timings, "gpu_wait", wait_for_release, req.get("gpus") or [],
                                    req["gpu_device_pattern"], req["gpu_memory_threshold_mib"],
                                    req["gpu_release_timeout"])
    except RuntimeError as exc:  # a refusal with its own fix, not a crash: keep what was stopped
        raise LifecycleError(str(exc))
    os.makedirs(req["run_dir"], exist_ok=True)
    now = time.time()
    proc, result["kept"] = _timed(timings, "launch", launch, req, now)
    result["pid"] = proc.pid
    result["fingerprint"] = req["fingerprint"]
    result["world"] = req.get("job")
    # Still under the lock: a concurrent restart must not stop this launch before it is proven live.
    try:
        result["heartbeat"] = _timed(timings, "verify", verify, req, proc, timings)
    except LifecycleError as exc:
        raise _stopped_after_failed_verify(req, proc, exc)
    if req.get("job"):
        result["ranks"] = rank_states(req["run_dir"], _read_json(os.path.join(req["run_dir"], "launch.json")))


def _os_text(exc):
    return "could not write %s: %s" % (exc.filename or "the run directory", exc.strerror or exc)


def _run_dir_of(req, name):
    return req["run_dir"] if name == req["run"] else os.path.join(req["runs_root"], name)


def _stopped_note(req, stopped):
    """'the previous run r1 (pid 42) was stopped (SIGTERM) before this failure; its last checkpoint is …'."""
    parts = []
    for info in stopped:
        run_dir = _run_dir_of(req, info["run"])
        launch_info = _read_json(os.path.join(run_dir, "launch.json")) or {}
        ckpt = last_checkpoint(checkpoints_dir(launch_info.get("argv"), run_dir))
        parts.append("the previous run %s (pid %s) was stopped (%s) before this failure; %s" % (
            info["run"], info["pid"], info["signal"],
            "its last checkpoint is %s" % ckpt if ckpt else "it has no checkpoint (%s is empty)"
            % checkpoints_dir(launch_info.get("argv"), run_dir)))
    return "; ".join(parts)


def _after_stop(exc, stopped, note):
    """Every failure after a stop says that the previous run was stopped and where its work is."""
    facts = dict(exc.facts, stopped=stopped, changed=bool(stopped))
    return LifecycleError("%s; %s" % (exc, note) if note else str(exc), **facts)


def _handle(req):
    validate_run_name(req.get("run"))
    return status(req) if req["action"] == "status" else change(req)


def main(req):
    # ValueError: a request the controller should have refused.
    answer(_handle, req, (LifecycleError, ValueError), "lifecycle error")
