# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""A run's identity and configuration: name rules, the trainer argv, the fingerprint, the request.

Everything here is checked on the controller side of the transport, before any command runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.run_name import validate_run_name
from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.run_paths import (
    check_not_system_dir, check_reserved_env)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.trainer_check import check_argv
from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport.command import validate_env

FLAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # fullmatch: "$" would let a trailing newline in


def _absolute(path, what):
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise ValueError("%s must be an absolute path, got %r" % (what, path))
    return posixpath.normpath(path)


def trainer_argv(command, trainer_args):
    """command + ``--flag=value`` items: true → bare flag, false/None → left out, list → comma-joined."""
    if not command or not all(isinstance(c, str) and c for c in command):
        raise ValueError("command must be a non-empty list of strings (the trainer executable first), got %r"
                         % (command,))
    argv = list(command)
    for key in sorted(trainer_args or {}):
        value = trainer_args[key]
        flag = key.replace("_", "-")
        if not FLAG_RE.fullmatch(flag):
            raise ValueError("invalid trainer flag name %r: use letters, digits, - and _" % (key,))
        if value is None or value is False:
            continue
        if value is True:
            argv.append("--" + flag)
        elif isinstance(value, dict):
            raise ValueError("trainer flag %r has a mapping value; give a string, number, bool or list" % key)
        else:
            # --flag=value: a value that starts with '-' (or is --help) can never be read as a flag.
            text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
            argv.append("--%s=%s" % (flag, text))
    if any("\0" in a for a in argv):
        raise ValueError("the trainer command contains a NUL byte, which no process can receive")
    return argv


TORCHRUN_MODULE = "torch.distributed.run"  # torchrun, run by the trainer's own interpreter


def torchrun_argv(command, nproc, stop_timeout):
    """torchrun's command line (one host, --standalone) that runs `command` in nproc ranks.

    The interpreter is command[0] when it is a python (then the rest, e.g. ``-m dflash_trainer.cli``, goes to
    torchrun as it is), else the ``python`` beside command[0] (a venv's bin/dflash-train: torchrun runs that script
    with it). --shutdown-timeout (how long torchrun lets its ranks finish after a SIGTERM of its own) is at least
    the stop timeout, although the lifecycle's stop never relies on it: it signals every rank itself.
    """
    prog = command[0]
    if posixpath.basename(prog).startswith("python"):
        python, rest = prog, list(command[1:])
    else:
        if not prog.startswith("/"):
            raise ValueError("with nproc_per_node > 1 the trainer command must be an absolute path in its virtual "
                             "environment (e.g. /opt/dflash/venv/bin/dflash-train), got %r: torchrun runs it with "
                             "the python beside it" % (prog,))
        python, rest = posixpath.join(posixpath.dirname(prog), "python"), list(command)
    # --local-addr: one host, so the ranks meet the agent's store on loopback, whatever the hostname resolves to
    # (an LXC container named by its vmid, "200", resolves as the IPv4 address 0.0.0.200; no ranks ever connect).
    return [python, "-m", TORCHRUN_MODULE, "--standalone", "--local-addr=127.0.0.1", "--nproc-per-node=%d" % nproc,
            "--shutdown-timeout=%d" % shutdown_timeout(stop_timeout)] + rest


def shutdown_timeout(stop_timeout):
    return max(1, int(math.ceil(stop_timeout)))


def job_argv_and_spec(params, run_dir):
    """(argv, check argv, launch.json's `job`) of the run: the trainer's command line (or for nproc_per_node > 1
    torchrun's running it), the same flags after the trainer's own ``--check`` (the lifecycle runs it before anything
    is stopped), and the job's process count and torchrun's shutdown timeout (job None for one process). The world
    layout and where the ranks register are the trainer's rules: the lifecycle fills them in from the check's answer
    (container/trainer_check.py), this side holds no copy of them."""
    nproc, trainer_args = params["nproc_per_node"], params["trainer_args"] or {}
    if nproc < 1:
        raise ValueError("nproc_per_node must be 1 (one process) or more (a torchrun job), got %d" % nproc)
    argv = trainer_argv(params["command"], trainer_args)  # validates the command first
    checked = check_argv(params["command"], argv[len(params["command"]):])
    if nproc == 1:
        return argv, checked, None
    argv = trainer_argv(torchrun_argv(params["command"], nproc, params["stop_timeout"]), trainer_args)
    return argv, checked, {"launcher": "torchrun", "nproc_per_node": nproc, "ranks_dir": None, "layout": None,
                           "shutdown_timeout_s": shutdown_timeout(params["stop_timeout"])}


def fingerprint(argv, env, gpus, secret_names, cwd):
    """Hash of what defines the run. Secret values are left out on purpose (rotate one with force=true)."""
    doc = {"argv": argv, "env": dict((k, str(v)) for k, v in (env or {}).items()), "gpus": sorted(gpus or []),
           "secret_env_names": sorted(secret_names or []), "cwd": cwd}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def build_request(params, check_mode=False, diff=False):
    """Validate module params (every option present, defaults filled by the argument spec) and return the
    JSON request for the in-container run_lifecycle.main()."""
    name = validate_run_name(params["name"])
    runs_root = check_not_system_dir(_absolute(params["runs_root"], "runs_root"), "runs_root")
    run_dir = check_not_system_dir(_absolute(params["run_dir"] or posixpath.join(runs_root, name), "run_dir"),
                                   "run_dir")
    gpus = list(params["gpus"] or [])
    if any((not isinstance(g, int)) or g < 0 for g in gpus):
        raise ValueError("gpus must be a list of GPU indexes (integers >= 0), got %r" % (gpus,))
    env = dict(params["env"] or {})
    secret_env = dict(params["secret_env"] or {})
    validate_env(env)
    validate_env(secret_env)
    check_reserved_env(env, secret_env)
    clash = sorted(set(env) & set(secret_env))
    if clash:
        raise ValueError("%s set in both env and secret_env: keep each variable in one of them" % ", ".join(clash))
    cwd = _absolute(params["cwd"], "cwd") if params["cwd"] else None
    if params["keep_records"] < 0:
        raise ValueError("keep_records must be 0 or more (earlier logs and launch records kept), got %d"
                         % params["keep_records"])
    if "{index}" not in params["gpu_device_pattern"]:
        raise ValueError("gpu_device_pattern must contain {index}, e.g. /dev/nvidia{index}")
    state = params["state"]
    req = dict((key, params[key]) for key in _PASSED_THROUGH)
    req.update(action=state, check_mode=bool(check_mode), diff=bool(diff), run=name, runs_root=runs_root,
               run_dir=run_dir, gpus=gpus, cwd=cwd, force=bool(params["force"]))
    if state in ("started", "restarted"):
        argv, checked, job = job_argv_and_spec(params, run_dir)
        req.update(job=job, argv=argv, check_argv=checked, env=env, secret_env=secret_env,
                   fingerprint=fingerprint(argv, env, gpus, secret_env.keys(), cwd))
    return req


# Options the lifecycle reads as they are (types already converted by the argument spec).
_PASSED_THROUGH = ("stop_timeout", "gpu_release_timeout", "gpu_memory_threshold_mib", "gpu_device_pattern",
                   "settle_time", "heartbeat_timeout", "wait_for_phase", "phase_timeout", "log_tail_lines",
                   "status_log_lines", "lock_timeout", "expect_trainer_version", "keep_records", "report")
