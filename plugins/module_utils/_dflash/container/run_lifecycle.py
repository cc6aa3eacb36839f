# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The run lifecycle, executed INSIDE the training container: JSON request in, JSON result out.

One transport call ships this package (controller/lifecycle_shipping.py) and calls main(), so that a restart
costs one `pct exec`, and the same code is what local mode and the container tests exercise. Stdlib only.

Run directory contract (docs/design.md): launch.json, pid, train.log, heartbeat.json, checkpoints/, metrics.jsonl,
telemetry.jsonl.
"""

import os
import time

from .entry import answer
from .file_lock import FileLock
from .gpu_release import check_gpus_exist, wait_for_release
from .job_ranks import is_healthy, rank_states, stop_job
from .job_nodes import node_label
from .job_steps import refuse_if_reserved, release, reserve, reserved, verify_node, wait_while_reserved
from .lifecycle_error import LifecycleError, os_text
from .procfs import POLL_S, stop_group
from .run_launch import error_line, launch, launch_path, trainer_check, verify
from .run_name import validate_run_name
from .run_paths import check_not_system_dir, check_reserved_env
from .run_records import EXIT_RECORD, LOG_NAME, STOP_RECORD, read_json, read_pid, record
from .run_space import check_space, last_checkpoint, recorded_checkpoints
from .run_status import conflicting_runs, log_tail, own_heartbeat, plan_fields, run_state, status
from .trainer_check import CheckRefused
from .trainer_record import TrainerRefused, check_trainer

LOCK_NAME = ".dflash-lifecycle.lock"


def lifecycle_lock(root, timeout_s):
    """One lifecycle operation per container (runs root) at a time."""
    return FileLock(os.path.join(root, LOCK_NAME), timeout_s, lambda path, t: LifecycleError(
        "another restart/stop of this container held %s for %ss; wait for it to finish (or raise lock_timeout)"
        % (path, t)), poll_s=POLL_S)


def _timed(timings, name, fn, *args):
    t0 = time.monotonic()
    try:
        return fn(*args)
    finally:
        timings[name] = round(time.monotonic() - t0, 3)


def stop_run(run_dir, pid, timeout):
    """Stop what is left of a run: its process group, or for a torchrun job every rank and then the agent."""
    launch_info = read_json(os.path.join(run_dir, "launch.json"))
    if (launch_info or {}).get("job"):
        return stop_job(pid, run_dir, launch_info, timeout)
    return stop_group(pid, timeout)


def _stop_all(req, runs):
    stopped = []
    for name, pid in runs:
        run_dir = _run_dir_of(req, name)
        info = stop_run(run_dir, pid, req["stop_timeout"])
        pid = pid if pid is not None else read_pid(run_dir)  # the agent's pid, also when it died before
        info.update(run=name, pid=pid)
        stopped.append(info)
        record(run_dir, STOP_RECORD, {"pid": pid, "signal": info["signal"], "waited_s": info["waited_s"],
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
        if not check:
            refuse_if_reserved(req, LifecycleError)  # a restart of a job over nodes holds this node
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
        settings = checked_settings(req, runs, timings)
        result.update(changed=True, action="launched", would_stop=[name for name, _pid in runs],
                      launch_reason=launch_reason(req, own_pid, own_launch))
        result.update(plan_fields(req["run_dir"]))  # the layout advisor's verdict, if it was asked (issue 31)
        if check:
            return result
        result["stopped"] = _timed(timings, "stop", _stop_all, req, runs)
        # Where each stopped run left its work, read before launch() moves this run's launch.json aside.
        stopped_note = _stopped_note(req, result["stopped"])
        try:
            _launch_after_stop(req, result, timings, settings)
        except LifecycleError as exc:
            raise _after_stop(exc, result["stopped"], stopped_note)
        except OSError as exc:  # a full disk, a read-only mount: name the path, never a bare errno
            raise _after_stop(LifecycleError(os_text(exc)), result["stopped"], stopped_note)
    result["phase"] = result["heartbeat"].get("phase")
    return result


def launch_reason(req, own_pid, own_launch):
    """Why this launch happens, in the words the trainer logs: first launch, config change (the fingerprint
    differs), force (same configuration, -e force=true), crash (the last process is gone without finishing),
    relaunch (it finished or was stopped). Kept in req for launch()."""
    if own_launch is None:
        reason = "first launch"
    elif own_launch.get("fingerprint") != req.get("fingerprint"):
        reason = "config change"
    elif own_pid is not None:
        reason = "force" if req.get("force") else "unverified process replaced"
    else:
        hb = read_json(os.path.join(req["run_dir"], "heartbeat.json")) or {}
        reason = "relaunch" if hb.get("phase") == "finished" else "crash"
    req["launch_reason"] = reason
    return reason


def checked_settings(req, runs, timings):
    """Before anything is stopped: the trainer's check of the launch (a launch that cannot start must not cost the
    running run), its settings, the GPUs and the space; LifecycleError naming the refusal."""
    try:
        check_trainer(req["argv"], launch_path(req), req.get("cwd") or req["run_dir"],
                      req.get("expect_trainer_version"))
        settings = _timed(timings, "trainer_check", trainer_check, req)
        check_gpus_exist(req.get("gpus") or [], req["gpu_device_pattern"])
        check_space(settings, req["run_dir"])
        return settings
    except TrainerRefused as exc:
        raise LifecycleError(str(exc), rc=exc.rc)
    except CheckRefused as exc:
        raise LifecycleError("the trainer's check refused this configuration, so nothing was stopped%s: %s"
                             % (_still_running(runs), exc), bad_input=True)
    except ValueError as exc:
        raise LifecycleError(str(exc))


def _still_running(runs):
    alive = ["%s (pid %s)" % (name, pid) for name, pid in runs if pid is not None]
    return " (%s still running)" % ", ".join(alive) if alive else ""


def _launch_after_stop(req, result, timings, settings):
    try:
        result["gpu_wait"] = _timed(timings, "gpu_wait", wait_for_release, req.get("gpus") or [],
                                    req["gpu_device_pattern"], req["gpu_memory_threshold_mib"],
                                    req["gpu_release_timeout"])
    except RuntimeError as exc:  # a refusal with its own fix, not a crash: keep what was stopped
        raise LifecycleError(str(exc))
    os.makedirs(req["run_dir"], exist_ok=True)
    now = time.time()
    proc, result["kept"] = _timed(timings, "launch", launch, req, now, settings)
    result["pid"] = proc.pid
    result["fingerprint"] = req["fingerprint"]
    result["world"] = req.get("job")
    # Still under the lock: a concurrent restart must not stop this launch before it is proven live.
    try:
        result["heartbeat"] = _timed(timings, "verify", verify, req, proc, timings)
    except LifecycleError as exc:
        raise _stopped_after_failed_verify(req, proc, exc)
    if req.get("job"):
        result["ranks"] = rank_states(req["run_dir"], read_json(os.path.join(req["run_dir"], "launch.json")))


def _run_dir_of(req, name):
    return req["run_dir"] if name == req["run"] else os.path.join(req["runs_root"], name)


def _stopped_note(req, stopped):
    """'the previous run r1 (pid 42) was stopped (SIGTERM) before this failure; its last checkpoint is …'."""
    parts = []
    for info in stopped:
        run_dir = _run_dir_of(req, info["run"])
        launch_info = read_json(os.path.join(run_dir, "launch.json")) or {}
        ckpt = last_checkpoint(recorded_checkpoints(launch_info, run_dir))
        parts.append("the previous run %s (pid %s) was stopped (%s) before this failure; %s" % (
            info["run"], info["pid"], info["signal"],
            "its last checkpoint is %s" % ckpt if ckpt else "it has no checkpoint (%s is empty)"
            % recorded_checkpoints(launch_info, run_dir)))
    return "; ".join(parts)


def _after_stop(exc, stopped, note):
    """Every failure after a stop says that the previous run was stopped and where its work is."""
    facts = dict(exc.facts, stopped=stopped, changed=bool(stopped))
    return LifecycleError("%s; %s" % (exc, note) if note else str(exc), **facts)


def job_step(req):
    """One step of restarting a job over nodes on this node (job_steps.py), under this node's lifecycle lock."""
    step, timings = req["job_step"], {}
    result = {"run": req["run"], "run_dir": req["run_dir"], "changed": False, "job_step": step,
              "node": node_label(req), "timings": timings}
    if req.get("check_mode"):
        return result
    os.makedirs(req["runs_root"], exist_ok=True)
    if step == "reserve":  # another restart holds the node: wait for it, outside the lock its steps take
        waited = wait_while_reserved(req, LifecycleError)
        if waited:
            result["waited_for"] = waited
    with lifecycle_lock(req["runs_root"], req["lock_timeout"]):
        if step == "release":
            result["released"] = release(req)
            return result
        if step == "reserve":
            refuse_if_reserved(req, LifecycleError)
            result.update(reserve(req, lambda r: checked_settings(r, conflicting_runs(r)[0], timings)))
            return result
        held = reserved(req, LifecycleError)
        if step == "stop":  # then this node's GPU release: once every node answered, it holds everywhere
            runs = conflicting_runs(req)[0]
            result["stopped"] = _timed(timings, "stop", _stop_all, req, runs)
            result["changed"] = bool(runs)
            try:
                result["gpu_wait"] = _timed(timings, "gpu_wait", wait_for_release, req.get("gpus") or [],
                                            req["gpu_device_pattern"], req["gpu_memory_threshold_mib"],
                                            req["gpu_release_timeout"])
            except RuntimeError as exc:
                raise LifecycleError("%s: %s" % (node_label(req), exc))
        elif step == "launch":
            _launch_node(req, held, result, timings)
        elif step == "verify":  # and, once this node's part is proven live, its reservation goes
            req["job"] = (read_json(os.path.join(req["run_dir"], "launch.json")) or {}).get("job") or req["job"]
            result.update(_timed(timings, "verify", verify_node, req, LifecycleError,
                                 lambda r, pid: stop_run(r["run_dir"], pid, r["stop_timeout"])))
            result["released"] = release(req)
    return result


def _launch_node(req, held, result, timings):
    """Launch this node's torchrun agent (it waits in the rendezvous for the other nodes: verify comes after every
    node launched); fails naming the node when it exits within settle_time."""
    settings = held.get("settings")
    if settings is None:  # this node ran the same configuration at reserve time; another node made the restart
        settings = checked_settings(req, [], timings)
    else:
        req["job"] = held.get("job") or req["job"]
    os.makedirs(req["run_dir"], exist_ok=True)
    proc, result["kept"] = _timed(timings, "launch", launch, req, time.time(), settings)
    result.update(pid=proc.pid, fingerprint=req["fingerprint"], world=req["job"], changed=True, action="launched")
    deadline = time.monotonic() + req["settle_time"]
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(POLL_S)
    if proc.poll() is not None:
        record(req["run_dir"], EXIT_RECORD, {"pid": proc.pid, "rc": proc.returncode, "at": time.time()})
        tail = log_tail(os.path.join(req["run_dir"], LOG_NAME), req["log_tail_lines"])
        raise LifecycleError("%s: the torchrun agent exited with status %s right after launch%s" % (
            node_label(req), proc.returncode, error_line(tail)), rc=proc.returncode, log_tail=tail, **result)


def _handle(req):
    validate_run_name(req.get("run"))
    if req.get("job_step"):
        return job_step(req)
    return status(req) if req["action"] == "status" else change(req)


def main(req):
    # ValueError: a request the controller should have refused.
    answer(_handle, req, (LifecycleError, ValueError), "lifecycle error")
