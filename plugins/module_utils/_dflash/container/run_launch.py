# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Starting the trainer and proving it alive, INSIDE the training container (run_lifecycle.py decides when): the
trainer's environment and its check of the launch, the detached launch (new session, pid file, launch.json, log),
and the verification (alive, our command line, its own heartbeat, every torchrun rank, the wanted phase); a launch
that fails is named by one line. Stdlib only."""

import errno
import os
import re
import subprocess
import time

from .job_ranks import clear_rank_files, rank_states
from .lifecycle_error import LifecycleError, os_text
from .plain_text import plain
from .procfs import POLL_S, cmdline, cmdline_matches
from .rank_ends import describe_rank
from .run_paths import LAUNCH_REASON_ENV
from .run_records import (EXIT_RECORD, LOG_NAME, exit_text, keep_previous, prune_records, read_json, record, restore,
                          unlink, write_json_atomic, write_pidfile)
from .run_status import first_failed_rank, log_tail, own_heartbeat_of
from .trainer_check import check_cwd, collection_layout, run_check

ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception)\b")  # a Python exception's last line
LAUNCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # unless the run's env sets PATH


def launch_path(req):
    """The PATH the trainer is found on: the run's env's, else LAUNCH_PATH."""
    return str((req.get("env") or {}).get("PATH", LAUNCH_PATH))


NODE_RANKS_ENV = "DFLASH_NODE_RANKS"  # the trainer's variable for each node's rank count (distributed/nodes.py)


# The trainer's variable for when a stop still under way prints every thread's stack to the log (stop_report.py):
# at nine tenths of the stop timeout, so a stop that hangs shows where just before the lifecycle (or torchrun, whose
# --shutdown-timeout is the same) SIGKILLs it, and a long but healthy checkpoint save prints nothing. A run's env
# may set it itself.
STOP_REPORT_ENV = "DFLASH_STOP_REPORT_S"
STOP_REPORT_FRACTION = 0.9


def launch_env(req, secrets=True):
    """The trainer's environment: PATH, when a hanging stop reports, the run's env (and secret env), the run
    contract's two variables; for a job over nodes, each node's rank count (torchrun tells a rank only its own
    node's, the layout needs all)."""
    env = {"PATH": LAUNCH_PATH}
    if req.get("stop_timeout"):
        env[STOP_REPORT_ENV] = "%g" % (STOP_REPORT_FRACTION * req["stop_timeout"])
    env.update(dict((k, str(v)) for k, v in (req.get("env") or {}).items()))
    if secrets:
        env.update(dict((k, str(v)) for k, v in (req.get("secret_env") or {}).items()))
    env.update(DFLASH_RUN_DIR=req["run_dir"], DFLASH_RUN_NAME=req["run"])
    nodes = (req.get("job") or {}).get("nodes")
    if nodes:
        env[NODE_RANKS_ENV] = ",".join(str(n["nproc_per_node"]) for n in nodes)
    return env


def trainer_check(req):
    """The trainer's check of this launch (trainer_check.py): its settings, and a torchrun job's layout (every
    rank's role, GPU and node: the trainer's answer) and ranks' directory filled in from its answer. CheckRefused
    when it refuses."""
    env = launch_env(req, secrets=False)  # no check reads a secret: they stay out of one more process
    if req.get("job"):  # the whole job's rank count and, over nodes, this node's index (torchrun's names)
        env["WORLD_SIZE"] = str(req["job"].get("world_size") or req["job"]["nproc_per_node"])
        if req["job"].get("nodes"):
            env["GROUP_RANK"] = str(req["job"]["node"])
    report = run_check(req["check_argv"], env, check_cwd(req), req["heartbeat_timeout"])
    settings = report.get("settings") or {}
    settings.setdefault("checkpoints", os.path.join(req["run_dir"], "checkpoints"))
    if req.get("job"):
        ranks_root = settings.get("run_dir") or req["run_dir"]
        req["job"] = dict(req["job"], layout=collection_layout(report.get("layout"), bool(req["job"].get("nodes"))),
                          ranks_dir=os.path.join(ranks_root, "ranks"))
    return settings


def launch(req, now, settings):
    run_dir = req["run_dir"]
    kept = keep_previous(run_dir, now)
    prune_records(run_dir, req["keep_records"])
    public = {
        "run": req["run"], "argv": req["argv"], "env": req.get("env") or {},
        "secret_env_names": sorted((req.get("secret_env") or {}).keys()), "gpus": req.get("gpus") or [],
        "cwd": req.get("cwd"), "fingerprint": req["fingerprint"], "launched_at": now, "log": LOG_NAME,
        "checkpoints": settings["checkpoints"],  # the trainer's answer (its check)
        # torchrun: world layout and where the ranks register; run_dir = the DFLASH_RUN_DIR every rank inherits
        "job": dict(req["job"], run_dir=run_dir) if req.get("job") else None,
    }
    env = launch_env(req)
    env[LAUNCH_REASON_ENV] = req.get("launch_reason") or "first launch"  # the trainer logs it (events.jsonl, W&B)
    log_path = os.path.join(run_dir, LOG_NAME)
    if public["job"]:
        clear_rank_files(public["job"]["ranks_dir"])  # the previous job is stopped: its leftover files say nothing
    try:
        write_json_atomic(os.path.join(run_dir, "launch.json"), public)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    except OSError as exc:
        restore(kept, run_dir)
        raise LifecycleError(os_text(exc))
    try:
        proc = subprocess.Popen(
            req["argv"], stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
            # New session: no controlling terminal, so the terminal's hangup when `pct exec -tt`
            # or the SSH session ends cannot reach it. close_fds: our stdout pipe must not leak.
            start_new_session=True, close_fds=True, env=env, cwd=req.get("cwd") or run_dir,
            preexec_fn=lambda: write_pidfile(run_dir),
        )
    except subprocess.SubprocessError as exc:  # the pid file could not be written in the child (a full disk)
        unlink(os.path.join(run_dir, "pid.tmp"))
        unlink(log_path)
        restore(kept, run_dir)
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
        return _failed_at_launch(req, proc, rc)

    while True:
        rc = proc.poll()
        if rc is not None:
            raise died(rc)
        elapsed = time.monotonic() - start
        hb = read_json(hb_path)
        fresh = hb is not None and hb.get("pid") == proc.pid
        if fresh and first_hb is None:
            first_hb = round(elapsed, 3)
            timings["first_heartbeat"] = first_hb
        if fresh and hb.get("phase") == "failed":  # the same line as its exit seen first (died)
            raise _failed_at_launch(req, proc, _wait_exit(proc, 5))
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


def _failed_at_launch(req, proc, rc):
    """One line for a launch that failed, whether its exit or its `failed` heartbeat was seen first: the exit
    (recorded in exit.json), the first failed rank of a torchrun job, then the trainer's own error (its heartbeat's,
    else its log's error line), as plain text."""
    run_dir = req["run_dir"]
    log_path = os.path.join(run_dir, LOG_NAME)
    hb = own_heartbeat_of(run_dir, proc.pid)
    tail = log_tail(log_path, req["log_tail_lines"])
    first = first_failed_rank(run_dir, read_json(os.path.join(run_dir, "launch.json")))
    if rc is not None:
        record(run_dir, EXIT_RECORD, dict({"pid": proc.pid, "rc": rc, "at": time.time()},
                                          **({"failed_rank": first} if first else {})))
    error = (hb or {}).get("error") if (hb or {}).get("phase") == "failed" else None
    cause = ": %s" % plain(error) if error else error_line(tail)
    return LifecycleError("the trainer failed right after launch (exit %s%s)%s; see log_tail (%s)"
                          % (exit_text(rc), "; %s first" % describe_rank(first) if first else "", cause, log_path),
                          rc=rc, pid=proc.pid, log_tail=tail, heartbeat=hb, failed_rank=first)


def error_line(tail):
    """': <the trainer's own error line>' from its log's last lines (the last `error:` or `…Error: …` line, else
    the last line), or ''."""
    lines = [line.strip() for line in tail or [] if line.strip()]
    errors = [line for line in lines if "error:" in line.lower() or ERROR_LINE.match(line)]
    pick = (errors or lines)[-1:]
    return ": %s" % plain(pick[0]) if pick else ""


def _job_ranks_up(req, proc, log_path):
    """The torchrun job's ranks once all of them registered, alive; None while some have not registered yet."""
    ranks = rank_states(req["run_dir"], read_json(os.path.join(req["run_dir"], "launch.json")))
    if any(not r["alive"] for r in ranks):  # the agent ends the job: its exit and the first cause, in one line
        raise _failed_at_launch(req, proc, _wait_exit(proc, 10))
    return ranks if len(ranks) >= req["job"]["nproc_per_node"] else None


def _wait_exit(proc, timeout):
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
