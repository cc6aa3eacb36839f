# -*- coding: utf-8 -*-
# Copyright: dflash.ops contributors
# Apache License 2.0
"""A run's identity and configuration: name rules, the trainer argv, the fingerprint, the request.

Everything here is checked on the controller side of the transport, before any command runs.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re

from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport import validate_env

RUN_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
FLAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def validate_run_name(name):
    if not isinstance(name, str) or not RUN_NAME_RE.match(name) or name in (".", ".."):
        raise ValueError(
            "invalid run name %r: use 1-64 letters, digits, '.', '_' or '-' (e.g. slammed5)" % (name,)
        )
    return name


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
        if not FLAG_RE.match(flag):
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


def fingerprint(argv, env, gpus, secret_names, cwd):
    """Hash of what defines the run. Secret values are left out on purpose (rotate one with force=true)."""
    doc = {"argv": argv, "env": dict((k, str(v)) for k, v in (env or {}).items()), "gpus": sorted(gpus or []),
           "secret_env_names": sorted(secret_names or []), "cwd": cwd}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


_STATE_TO_ACTION = {"started": "started", "restarted": "restarted", "stopped": "stopped", "status": "status"}


def build_request(params, check_mode=False):
    """Validate module params and return the JSON request for run_lifecycle.main()."""
    name = validate_run_name(params["name"])
    runs_root = _absolute(params.get("runs_root") or "/workspace/runs", "runs_root")
    run_dir = _absolute(params.get("run_dir") or posixpath.join(runs_root, name), "run_dir")
    gpus = list(params.get("gpus") or [])
    if any((not isinstance(g, int)) or g < 0 for g in gpus):
        raise ValueError("gpus must be a list of GPU indexes (integers >= 0), got %r" % (gpus,))
    env = dict(params.get("env") or {})
    secret_env = dict(params.get("secret_env") or {})
    validate_env(env)
    validate_env(secret_env)
    clash = sorted(set(env) & set(secret_env))
    if clash:
        raise ValueError("%s set in both env and secret_env: keep each variable in one of them" % ", ".join(clash))
    cwd = _absolute(params["cwd"], "cwd") if params.get("cwd") else None
    state = params.get("state") or "restarted"
    req = {
        "action": _STATE_TO_ACTION[state], "check_mode": bool(check_mode), "run": name,
        "runs_root": runs_root, "run_dir": run_dir, "gpus": gpus, "cwd": cwd,
        "force": bool(params.get("force")),
        "stop_timeout": float(params.get("stop_timeout", 120)),
        "gpu_release_timeout": float(params.get("gpu_release_timeout", 120)),
        "gpu_memory_threshold_mib": int(params.get("gpu_memory_threshold_mib", 1024)),
        "gpu_device_pattern": params.get("gpu_device_pattern") or "/dev/nvidia{index}",
        "settle_time": float(params.get("settle_time", 0.5)),
        "heartbeat_timeout": float(params.get("heartbeat_timeout", 120)),
        "wait_for_phase": params.get("wait_for_phase"),
        "phase_timeout": float(params.get("phase_timeout", 600)),
        "log_tail_lines": int(params.get("log_tail_lines", 40)),
        "status_log_lines": int(params.get("status_log_lines", 0)),
        "lock_timeout": float(params.get("lock_timeout", 900)),
    }
    if "{index}" not in req["gpu_device_pattern"]:
        raise ValueError("gpu_device_pattern must contain {index}, e.g. /dev/nvidia{index}")
    if state in ("started", "restarted"):
        argv = trainer_argv(params.get("command"), params.get("trainer_args"))
        req.update(argv=argv, env=env, secret_env=secret_env,
                   fingerprint=fingerprint(argv, env, gpus, secret_env.keys(), cwd))
    return req
