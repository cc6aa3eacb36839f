# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Ship the in-container package (module_utils/_dflash/container) and run it: one transport call, JSON in and out.

argv is a constant (``python3 -c BOOTSTRAP``); the package's sources and the request (secrets included)
travel on stdin, so nothing the user typed and no secret is ever in an argument vector. At the target the
sources become a real package (an in-memory importer), so their relative imports work as they do here.
"""

from __future__ import annotations

import inspect
import json
import sys

from ansible_collections.dflash.ops.plugins.module_utils._dflash import container
from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import (
    entry, file_digest, file_lock, gpu_release, job_nodes, job_ranks, job_steps, lifecycle_error, nvidia_userspace,
    nvidia_version, plain_text, procfs, rank_ends, run_launch, run_lifecycle, run_name, run_paths, run_records,
    run_report, run_space, run_status, trainer_check, trainer_install, trainer_record, trainer_venvs, weights_copy,
    weights_guards, weights_manifest, weights_progress, weights_stage)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport.command import TransportError

PACKAGE = "dflash_lifecycle"
ENTRY = PACKAGE + ".run_lifecycle"  # the default entry module

# Serves {module name: source} from stdin as package PACKAGE, imports the entry module and calls main(request).
BOOTSTRAP = (
    "import importlib.abc,importlib.util,json,sys\n"
    "d=json.load(sys.stdin);S=d['sources']\n"
    "class F(importlib.abc.MetaPathFinder,importlib.abc.Loader):\n"
    " def find_spec(self,n,p=None,t=None):\n"
    "  return importlib.util.spec_from_loader(n,self,is_package=n==d['package']) if n in S else None\n"
    " def create_module(self,s):return None\n"
    " def exec_module(self,m):exec(compile(S[m.__name__],m.__name__,'exec'),m.__dict__)\n"
    "sys.meta_path.insert(0,F())\n"
    "importlib.import_module(d['entry']).main(d['request'])\n"
)

_SOURCES = None


def sources():
    """{qualified name at the target: source} of the whole in-container package."""
    global _SOURCES
    if _SOURCES is None:
        _SOURCES = {PACKAGE: inspect.getsource(container)}
        for module in (entry, file_digest, file_lock, plain_text, procfs, rank_ends, job_nodes, job_ranks, job_steps,
                       gpu_release, run_name, run_paths, run_records, run_report, run_space, run_status,
                       lifecycle_error, run_launch, run_lifecycle,
                       weights_manifest, weights_copy, weights_guards, weights_progress, weights_stage, trainer_check,
                       trainer_record, trainer_venvs, trainer_install, nvidia_version, nvidia_userspace):
            _SOURCES["%s.%s" % (PACKAGE, module.__name__.rsplit(".", 1)[-1])] = inspect.getsource(module)
    return _SOURCES


def default_python(transport_mode):
    # Locally the module's own interpreter surely exists; in a container python3 is the one to expect.
    return sys.executable if transport_mode == "local" else "python3"


def call_in_container(transport, params, request, entry, label, passthrough=(), **failure_facts):
    """main(request) of container/<entry>.py at the target, for a module with python/timeout/transport options.

    A transport error or a refusal (failed/msg in the result) becomes ModuleFailure("<label>: <msg>") with the
    result's other keys (plus failure_facts) as facts; transport errors of the types in passthrough are raised
    as they are (for a caller to whom they are an answer, e.g. a stopped container to a stop).
    """
    try:
        result = run_lifecycle_remote(transport, request, timeout=params["timeout"], entry=entry,
                                      python=params["python"] or default_python(params["transport"]))
    except passthrough:
        raise
    except TransportError as exc:
        raise ModuleFailure(str(exc))
    if result.pop("failed", False):
        msg = result.pop("msg", "failed")
        result.update(failure_facts)
        raise ModuleFailure("%s: %s" % (label, msg), **result)
    return result


def run_lifecycle_remote(transport, request, python="python3", timeout=None, entry="run_lifecycle"):
    """Call main(request) of the in-container module `entry` at the transport's target; return its result dict.

    Every entry module's main() prints one JSON line: the result, with failed/msg on a refusal.
    """
    stdin = json.dumps({"sources": sources(), "package": PACKAGE, "entry": PACKAGE + "." + entry,
                        "request": request})
    rc, out, err = transport.run([python, "-c", BOOTSTRAP], stdin_data=stdin, timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if rc != 0 or not lines:
        detail = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
        if rc in (126, 127):
            raise TransportError("%s not found in %s: install python3 there (or set python=)"
                                 % (python, transport.describe()))
        raise TransportError("the lifecycle script failed in %s (exit %s): %s" % (transport.describe(), rc, detail))
    return json.loads(lines[-1])
