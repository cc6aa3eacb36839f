# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Backend of the pct_exec module (uses module.params and module.check_mode only)."""

from __future__ import annotations

import shlex

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport.command import (
    Transport, TransportError, transport_argument_spec)


def argument_spec():
    """pct_exec's options: the only place their defaults are declared (the docs are checked against it)."""
    own = ArgumentSpec(
        argument_spec=dict(
            argv=dict(type="list", elements="str"),
            cmd=dict(type="str"),
            env=dict(type="dict", default={}),
            login_shell=dict(type="bool", default=False),
            chdir=dict(type="path"),
            creates=dict(type="path"),
            removes=dict(type="path"),
            timeout=dict(type="float"),
            expected_rc=dict(type="list", elements="int", default=[0]),
        ),
        required_one_of=[("argv", "cmd")],
        mutually_exclusive=[("argv", "cmd")],
    )
    return transport_argument_spec().merge(own)


def _path_exists(transport, path, timeout):
    # `test -e` runs without a shell; the path is one argv element.
    return transport.run(["test", "-e", path], timeout=timeout)[0] == 0


def run_command(module):
    p = module.params
    try:
        argv = p["argv"] if p["argv"] is not None else shlex.split(p["cmd"])
        transport = Transport.from_params(p)
        full = transport.build_argv(argv, env=p["env"], login_shell=p["login_shell"], cwd=p["chdir"])
    except ValueError as exc:
        raise ModuleFailure(str(exc))
    result = {"changed": False, "argv": full}
    try:
        if p["creates"] and _path_exists(transport, p["creates"], p["timeout"]):
            result["skipped_reason"] = "%s exists" % p["creates"]
            return result
        if p["removes"] and not _path_exists(transport, p["removes"], p["timeout"]):
            result["skipped_reason"] = "%s does not exist" % p["removes"]
            return result
        result["changed"] = True
        if module.check_mode:
            return result
        rc, out, err = transport.run(argv, env=p["env"], login_shell=p["login_shell"], cwd=p["chdir"],
                                     timeout=p["timeout"])
    except TransportError as exc:
        raise ModuleFailure(str(exc), argv=full)
    result.update(rc=rc, stdout=out, stderr=err, stdout_lines=out.splitlines(), stderr_lines=err.splitlines())
    # Ansible fails any result whose rc is non-zero unless told otherwise: expected_rc decides here.
    result["failed"] = rc not in p["expected_rc"]
    if rc not in p["expected_rc"]:
        tail = (err.strip() or out.strip()).splitlines()[-1:] or ["no output"]
        raise ModuleFailure("command exited with status %d in %s: %s" % (rc, transport.describe(), tail[0]),
                            **result)
    return result
