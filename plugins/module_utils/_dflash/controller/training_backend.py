# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Backend of the training_run module: params → request → one transport call → result.

Uses only module.params, module.check_mode, module._diff and module.warn, so tests can pass a small stand-in.
"""

from __future__ import annotations

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.lifecycle_shipping import (
    call_in_container)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.remote_tmp_leftovers import (
    remove_leftovers)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.run_config import build_request
from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport.command import (
    ContainerNotRunning, Transport, transport_argument_spec)

STATES = ("started", "stopped", "restarted", "status")


def argument_spec():
    """training_run's options: the only place their defaults are declared (the docs are checked against it)."""
    own = ArgumentSpec(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", default="restarted", choices=list(STATES)),
            python=dict(type="str"),
            runs_root=dict(type="path", default="/workspace/runs"),
            run_dir=dict(type="path"),
            command=dict(type="list", elements="str"),
            trainer_args=dict(type="dict", default={}),
            nproc_per_node=dict(type="int", default=1),
            env=dict(type="dict", default={}),
            secret_env=dict(type="dict", default={}, no_log=True),
            gpus=dict(type="list", elements="int", default=[]),
            cwd=dict(type="path"),
            force=dict(type="bool", default=False),
            stop_timeout=dict(type="float", default=120),
            gpu_release_timeout=dict(type="float", default=120),
            gpu_memory_threshold_mib=dict(type="int", default=1024),
            gpu_device_pattern=dict(type="str", default="/dev/nvidia{index}"),
            settle_time=dict(type="float", default=0.5),
            heartbeat_timeout=dict(type="float", default=120),
            wait_for_phase=dict(type="str"),
            phase_timeout=dict(type="float", default=600),
            log_tail_lines=dict(type="int", default=40),
            status_log_lines=dict(type="int", default=0),
            report=dict(type="bool", default=False),
            lock_timeout=dict(type="float", default=900),
            keep_records=dict(type="int", default=20),
            expect_trainer_version=dict(type="str"),
            timeout=dict(type="float", default=3600),
            nodes=dict(type="list", elements="dict", default=[]),
            node=dict(type="int", default=0),
            rdzv_port=dict(type="int", default=29400),
            job_step=dict(type="str", choices=["reserve", "stop", "launch", "verify", "release"]),
            job_token=dict(type="str", no_log=False),  # no secret: it is part of the rendezvous id in argv
        ),
        required_if=[("state", "started", ("command",)), ("state", "restarted", ("command",))],
    )
    return transport_argument_spec().merge(own)


def manage_run(module):
    p = module.params
    # Before anything else: an interrupted play may have left this module's copy, secrets included, on the host.
    leftovers = remove_leftovers(getattr(module, "_remote_tmp", None))
    if leftovers:
        module.warn("removed %d module temp dir(s) left on this host by an interrupted play (they held the run's "
                    "arguments, secret_env included): %s" % (len(leftovers), ", ".join(leftovers)))
    try:
        request = build_request(p, check_mode=module.check_mode, diff=getattr(module, "_diff", False))
        transport = Transport.from_params(p)
    except ValueError as exc:
        raise ModuleFailure(str(exc))
    try:
        result = call_in_container(transport, p, request, "run_lifecycle", "run %s" % p["name"],
                                   passthrough=(ContainerNotRunning,) if request["action"] in ("stopped", "status")
                                   else (), run=request["run"], run_dir=request["run_dir"])
    except ContainerNotRunning as exc:
        # Nothing runs in a stopped container: a stop has nothing to do, a status says so.
        return {"changed": False, "run": request["run"], "run_dir": request["run_dir"], "alive": False,
                "pid": None, "action": "none", "phase": "container stopped", "state": "container stopped",
                "stopped": [], "heartbeat": None, "gpu_memory": None, "gpu_memory_note": "container stopped",
                "ranks": [], "log_tail": [], "container_note": str(exc)}
    if request["action"] == "started" and result.get("action") == "noop" and not result.get("same_config"):
        module.warn("run %s is alive with another configuration; use state=restarted to apply the new one"
                    % p["name"])
    result.setdefault("changed", False)
    return result
