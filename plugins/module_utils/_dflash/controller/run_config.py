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


def torchrun_argv(command, nproc, stop_timeout, rendezvous=None):
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
    where = rendezvous or ["--standalone", "--local-addr=127.0.0.1"]
    return [python, "-m", TORCHRUN_MODULE] + where + ["--nproc-per-node=%d" % nproc,
                                                      "--shutdown-timeout=%d" % shutdown_timeout(stop_timeout)] + rest


TOKEN_RE = re.compile(r"[A-Za-z0-9]{1,32}")
ADDRESS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")  # a host name or an IPv4/IPv6 address
RDZV_PLACEHOLDER = "{rdzv_id}"  # the fingerprint covers the job, not one restart's token


def node_plan(params):
    """The job over nodes: (nodes, this node's index, ranks before this node, world size), or None for one host.

    torchrun's c10d rendezvous numbers the nodes by their address (sorted as text; --node-rank is ignored), and
    global ranks follow that numbering; so the nodes must be listed in that order for node 0 to hold rank 0 (the
    target ranks and the heartbeat) and the rendezvous store."""
    nodes = params.get("nodes") or []
    if not nodes:
        return None
    rows = []
    for i, n in enumerate(nodes):
        if not isinstance(n, dict) or not isinstance(n.get("address"), str) or not ADDRESS_RE.fullmatch(n["address"]):
            raise ValueError("nodes[%d] must be {address: <host name or IP the other nodes reach>, nproc_per_node: "
                             "N}, got %r" % (i, n))
        nproc = n.get("nproc_per_node")
        if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
            raise ValueError("nodes[%d].nproc_per_node must be a whole number >= 1, got %r" % (i, nproc))
        rows.append({"address": n["address"], "nproc_per_node": nproc})
    addresses = [r["address"] for r in rows]
    if len(set(addresses)) != len(addresses):
        raise ValueError("nodes name the address %s twice; give each node its own address"
                         % sorted(a for a in addresses if addresses.count(a) > 1)[0])
    if addresses != sorted(addresses):
        raise ValueError("nodes %s are not in the order torchrun numbers them (its c10d rendezvous sorts the nodes' "
                         "addresses as text): list them as %s, the node for the target ranks first"
                         % (addresses, sorted(addresses)))
    node = params.get("node")
    if not isinstance(node, int) or not 0 <= node < len(rows):
        raise ValueError("node must be this host's index in nodes (0 to %d), got %r" % (len(rows) - 1, node))
    offset = sum(r["nproc_per_node"] for r in rows[:node])
    return rows, node, offset, sum(r["nproc_per_node"] for r in rows)


def rendezvous_argv(plan, rdzv_port, join_timeout):
    """torchrun's multi-node options (in place of --standalone): c10d on node 0's address, this node's address as
    its own (the ranks' MASTER_ADDR when it holds rank 0), the rendezvous id filled in per restart."""
    nodes, node = plan[0], plan[1]
    if not isinstance(rdzv_port, int) or not 1 <= rdzv_port <= 65535:
        raise ValueError("rdzv_port must be a TCP port (1-65535), got %r" % (rdzv_port,))
    return ["--nnodes=%d" % len(nodes), "--node-rank=%d" % node, "--rdzv-backend=c10d",
            "--rdzv-endpoint=%s:%d" % (nodes[0]["address"], rdzv_port), "--rdzv-id=" + RDZV_PLACEHOLDER,
            # node 0 hosts the rendezvous store, never a guess from the host name (containers sharing addresses)
            "--rdzv-conf=join_timeout=%d,is_host=%d" % (max(1, int(math.ceil(join_timeout))), int(node == 0)),
            "--max-restarts=0",
            "--local-addr=%s" % nodes[node]["address"]]


def shutdown_timeout(stop_timeout):
    return max(1, int(math.ceil(stop_timeout)))


def job_argv_and_spec(params, run_dir):
    """(argv, check argv, launch.json's `job`) of the run: the trainer's command line (or for nproc_per_node > 1
    torchrun's running it), the same flags after the trainer's own ``--check`` (the lifecycle runs it before anything
    is stopped), and the job's process count and torchrun's shutdown timeout (job None for one process). The world
    layout and where the ranks register are the trainer's rules: the lifecycle fills them in from the check's answer
    (container/trainer_check.py), this side holds no copy of them."""
    nproc, trainer_args = params["nproc_per_node"], params["trainer_args"] or {}
    plan = node_plan(params)
    if plan is not None:
        nproc = plan[0][plan[1]]["nproc_per_node"]
    if nproc < 1:
        raise ValueError("nproc_per_node must be 1 (one process) or more (a torchrun job), got %d" % nproc)
    argv = trainer_argv(params["command"], trainer_args)  # validates the command first
    checked = check_argv(params["command"], argv[len(params["command"]):])
    if nproc == 1 and plan is None:
        return argv, checked, None
    rendezvous = rendezvous_argv(plan, params.get("rdzv_port"), params["heartbeat_timeout"]) if plan else None
    argv = trainer_argv(torchrun_argv(params["command"], nproc, params["stop_timeout"], rendezvous), trainer_args)
    job = {"launcher": "torchrun", "nproc_per_node": nproc, "ranks_dir": None, "layout": None,
           "shutdown_timeout_s": shutdown_timeout(params["stop_timeout"])}
    if plan is not None:
        job.update(nodes=plan[0], node=plan[1], first_rank=plan[2], world_size=plan[3])
    return argv, checked, job


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
        fp = fingerprint(_job_view(argv, job, run_dir), env, gpus, secret_env.keys(), cwd)
        if job and job.get("nodes"):
            argv = _with_rdzv_id(argv, name, fp, params.get("job_token"))
        req.update(job=job, argv=argv, check_argv=checked, env=env, secret_env=secret_env, fingerprint=fp)
    if params.get("nodes"):
        req.update(job_step=_job_step(params), job_token=params.get("job_token"))
        if req.get("job") is None:  # stop/status of a job: this node's index and the nodes, for status
            plan = node_plan(params)
            req["nodes_view"] = {"nodes": plan[0], "node": plan[1]}
    return req


def _job_view(argv, job, run_dir):
    """What defines a job over nodes, the same on every node: argv less this node's own options (--node-rank,
    --local-addr, --nproc-per-node, --rdzv-conf's is_host) and with this node's run directory as a placeholder, plus
    every node's address and process count."""
    if not job or not job.get("nodes"):
        return argv
    own = ("--node-rank=", "--local-addr=", "--nproc-per-node=", "--rdzv-conf=")
    return [a.replace(run_dir, "{run_dir}") for a in argv if not a.startswith(own)] + [
        "nodes=%s" % json.dumps(job["nodes"], sort_keys=True)]


def _with_rdzv_id(argv, run, fp, token):
    """The rendezvous id: the run's name and fingerprint plus this restart's token, so that two launches of the
    same run never join each other's rendezvous."""
    if not isinstance(token, str) or not TOKEN_RE.fullmatch(token):
        raise ValueError("job_token must be 1-32 letters and digits, the same on every node of one restart (the "
                         "training role makes one), got %r" % (token,))
    rid = "%s-%s-%s" % (run, fp, token)
    return [a.replace(RDZV_PLACEHOLDER, rid) if a.startswith("--rdzv-id=") else a for a in argv]


JOB_STEPS = ("reserve", "stop", "launch", "verify", "release")


def _job_step(params):
    step = params.get("job_step")
    if params["state"] in ("started", "restarted") and step not in JOB_STEPS:
        raise ValueError("a job over nodes is restarted step by step on every node: job_step must be one of %s "
                         "(the training role runs them in order), got %r" % (", ".join(JOB_STEPS), step))
    if step is not None and step != "release" and params["state"] not in ("started", "restarted"):
        raise ValueError("job_step %s is part of a restart; with state=%s leave job_step out" % (step, params["state"]))
    if step is not None and not (isinstance(params.get("job_token"), str) and TOKEN_RE.fullmatch(params["job_token"])):
        raise ValueError("job_token must be 1-32 letters and digits, the same on every node of one restart, got %r"
                         % (params.get("job_token"),))
    return step


# Options the lifecycle reads as they are (types already converted by the argument spec).
_PASSED_THROUGH = ("stop_timeout", "gpu_release_timeout", "gpu_memory_threshold_mib", "gpu_device_pattern",
                   "settle_time", "heartbeat_timeout", "wait_for_phase", "phase_timeout", "log_tail_lines",
                   "status_log_lines", "lock_timeout", "expect_trainer_version", "keep_records", "report")
