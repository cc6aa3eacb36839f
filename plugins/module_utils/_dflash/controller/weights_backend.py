# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Backend of the model_weights module: params → checked request → one transport call (container/weights_stage).

Uses only module.params, module.check_mode and module._diff, so tests can pass a small stand-in.
"""

from __future__ import annotations

import posixpath
import re

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.lifecycle_shipping import (
    call_in_container)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport.command import (
    Transport, transport_argument_spec)

DEST_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # fullmatch; siblings are named .<name>.<tag>
SIGBUS_EXIT_RE = re.compile(r"\(exit (?:-7|135)\)")  # killed by SIGBUS: as a signal (local) or as 128+7 (a shell)


def argument_spec():
    """model_weights' options: the only place their defaults are declared (the docs are checked against it)."""
    own = ArgumentSpec(argument_spec=dict(
        source=dict(type="path", required=True),
        dest=dict(type="path", required=True),
        verify=dict(type="str", default="size", choices=["size", "full"]),
        force=dict(type="bool", default=False),
        runs_root=dict(type="path", default="/workspace/runs"),
        threads=dict(type="int", default=4),
        python=dict(type="str"),
        lock_timeout=dict(type="float", default=600),
        timeout=dict(type="float", default=7200),
        progress_file=dict(type="path"),
    ))
    return transport_argument_spec().merge(own)


def _absolute(path, what):
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise ValueError("%s must be an absolute path in the container, got %r" % (what, path))
    return posixpath.normpath(path)


def build_request(params, check_mode=False, diff=False):
    source = _absolute(params["source"], "source")
    dest = _absolute(params["dest"], "dest")
    runs_root = _absolute(params["runs_root"], "runs_root")
    name = posixpath.basename(dest)
    if posixpath.dirname(dest) == "/" or not DEST_NAME_RE.fullmatch(name):
        raise ValueError("dest %r must be a directory to create inside an existing one (e.g. /dev/shm/Qwen3.6-27B), "
                         "named with letters, digits, . _ or - (not starting with . _ or -)" % (params["dest"],))
    for a, b in ((source, dest), (dest, source)):
        if a == b or a.startswith(b + "/"):
            raise ValueError("source %s and dest %s overlap; stage into another directory (e.g. /dev/shm/<name>)"
                             % (source, dest))
    if not 1 <= params["threads"] <= 64:
        raise ValueError("threads must be between 1 and 64, got %r" % (params["threads"],))
    progress_file = _absolute(params["progress_file"], "progress_file") if params.get("progress_file") else None
    return {"progress_file": progress_file, "source": source, "dest": dest, "verify": params["verify"], "force": bool(params["force"]),
            "runs_root": runs_root, "threads": params["threads"], "lock_timeout": params["lock_timeout"],
            "check_mode": bool(check_mode), "diff": bool(diff)}


def stage_weights(module):
    p = module.params
    try:
        request = build_request(p, check_mode=module.check_mode, diff=getattr(module, "_diff", False))
        transport = Transport.from_params(p)
    except ValueError as exc:
        raise ModuleFailure(str(exc))
    try:
        result = call_in_container(transport, p, request, "weights_stage", "model_weights %s" % request["dest"],
                                   staged=request["dest"])
    except ModuleFailure as exc:
        if not SIGBUS_EXIT_RE.search(str(exc)):
            raise
        # the stager reads sources through a memory map; a source truncated under it kills it with SIGBUS
        raise ModuleFailure("model_weights %s: the stager died of SIGBUS, which a source file under %s shrinking "
                            "while it was copied causes; nothing was replaced (the previous copy is still served); "
                            "re-run when the model store is no longer being written (%s)"
                            % (request["dest"], request["source"], exc), **dict(exc.facts, staged=request["dest"]))
    if not getattr(module, "_diff", False):
        result.pop("diff", None)
    result.setdefault("changed", False)
    return result
