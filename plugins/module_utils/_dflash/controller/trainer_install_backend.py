# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Backend of the trainer_install module: params → plan (one transport call) → push the wheel (and wheelhouse)
→ install (one transport call). Uses only module.params, module.check_mode and module._diff."""

from __future__ import annotations

import os
import posixpath
import re

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.lifecycle_shipping import (
    call_in_container)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport.command import (
    Transport, TransportError, transport_argument_spec)

WHEEL_NAME_RE = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.+!]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl")
PIN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?\s*(==|>=|<=|~=|!=|<|>)\s*[A-Za-z0-9.*+!_-]+")
HEX_RE = re.compile(r"[0-9a-f]{16,64}")
INDEX_SCHEMES = ("https://", "http://", "file:///")


def argument_spec():
    """trainer_install's options: the only place their defaults are declared (the docs are checked against it)."""
    own = ArgumentSpec(
        argument_spec=dict(
            wheel=dict(type="path", required=True),
            wheel_sha256=dict(type="str", required=True),
            source_hash=dict(type="str", required=True),
            version=dict(type="str", required=True),
            pins=dict(type="list", elements="str", default=[]),
            wheelhouse=dict(type="path"),
            container_wheelhouse=dict(type="path"),
            index_url=dict(type="str"),
            venvs_root=dict(type="path", default="/opt/dflash/venvs"),
            link=dict(type="path", default="/opt/dflash/venv"),
            keep=dict(type="int", default=3),
            python=dict(type="str"),
            pip_timeout=dict(type="float", default=1800),
            compile_bytecode=dict(type="bool", default=True),
            timeout=dict(type="float", default=3600),
            progress_file=dict(type="path"),
        ),
        mutually_exclusive=[("index_url", "wheelhouse"), ("index_url", "container_wheelhouse")],
    )
    return transport_argument_spec().merge(own)


def _absolute(path, what):
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise ValueError("%s must be an absolute path, got %r" % (what, path))
    return posixpath.normpath(path)


def build_request(p):
    """Validate params; return the in-container request (without action)."""
    name = os.path.basename(p["wheel"] or "")
    if not WHEEL_NAME_RE.fullmatch(name):
        raise ValueError("wheel must be a wheel file (name-version-py-abi-platform.whl), got %r" % (p["wheel"],))
    _absolute(p["wheel"], "wheel")
    for key, what in (("wheel_sha256", "a sha256 hex digest"), ("source_hash", "a hex digest")):
        if not HEX_RE.fullmatch(p[key] or ""):
            raise ValueError("%s must be %s (the trainer_wheel module returns it), got %r" % (key, what, p[key]))
    if len(p["wheel_sha256"]) != 64:
        raise ValueError("wheel_sha256 must be 64 hex digits, got %r" % p["wheel_sha256"])
    if p["version"] != name.split("-")[1]:
        raise ValueError("version %r does not match the wheel %s" % (p["version"], name))
    for pin in p["pins"] or []:
        if not isinstance(pin, str) or not PIN_RE.fullmatch(pin.strip()):
            raise ValueError("pin %r is not a requirement such as torch==2.13.0 (pip options are not accepted)"
                             % (pin,))
    if p["keep"] < 1:
        raise ValueError("keep must be at least 1 (the current environment is always kept), got %s" % p["keep"])
    venvs_root = _absolute(p["venvs_root"], "venvs_root")
    link = _absolute(p["link"], "link")
    if link == venvs_root or link.startswith(venvs_root + "/") or venvs_root.startswith(link + "/"):
        raise ValueError("link %s and venvs_root %s must not contain one another: put them side by side "
                         "(/opt/dflash/venv, /opt/dflash/venvs)" % (link, venvs_root))
    if p["index_url"] and not p["index_url"].startswith(INDEX_SCHEMES):
        raise ValueError("index_url must start with https://, http:// or file:///, got %r" % p["index_url"])
    key = p["source_hash"][:16]
    staging = posixpath.join(venvs_root, ".staging-" + key)
    find_links = [staging]
    if p["container_wheelhouse"]:
        find_links.append(_absolute(p["container_wheelhouse"], "container_wheelhouse"))
    if p["wheelhouse"]:
        _absolute(p["wheelhouse"], "wheelhouse")
    return {"key": key, "source_hash": p["source_hash"], "version": p["version"], "wheel_name": name,
            "wheel_sha256": p["wheel_sha256"], "venvs_root": venvs_root, "link": link, "keep": p["keep"],
            "pins": [pin.strip() for pin in p["pins"] or []], "find_links": find_links,
            "no_index": bool(p["wheelhouse"] or p["container_wheelhouse"]), "index_url": p["index_url"],
            "pip_timeout": p["pip_timeout"], "compile_bytecode": p["compile_bytecode"],
            "progress_file": _absolute(p["progress_file"], "progress_file") if p.get("progress_file") else None}


def wheelhouse_files(directory):
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith((".whl", ".tar.gz", ".zip")))
    except OSError as exc:
        raise ModuleFailure("wheelhouse %s cannot be read on the managed host (%s): give a directory of wheels "
                            "there, or container_wheelhouse for one inside the container" % (directory, exc.strerror))
    if not names:
        raise ModuleFailure("wheelhouse %s holds no wheels" % directory)
    return [os.path.join(directory, n) for n in names]


def _call(transport, request, p):
    return call_in_container(transport, p, request, "trainer_install", "trainer install in %s" % transport.describe())


def install_trainer(module):
    p = module.params
    try:
        request = build_request(p)
        transport = Transport.from_params(p)
    except ValueError as exc:
        raise ModuleFailure(str(exc))
    try:
        planned = _call(transport, dict(request, action="plan", prepare=not module.check_mode,
                                        check_mode=module.check_mode), p)
        result = {"changed": planned["changed"], "key": request["key"], "version": request["version"],
                  "venv": planned["venv"], "link": request["link"], "previous": planned["previous"],
                  "up_to_date": planned["up_to_date"], "pruned": planned["would_prune"], "installed": False}
        if getattr(module, "_diff", False):
            result["diff"] = {"before": {"link": planned["previous"]},
                              "after": {"link": planned["venv"], "pruned": planned["would_prune"]}}
        if module.check_mode or not planned["changed"]:
            return result
        if planned.get("staging"):
            files = [p["wheel"]] + (wheelhouse_files(p["wheelhouse"]) if p["wheelhouse"] else [])
            for path in files:
                transport.push(path, posixpath.join(planned["staging"], os.path.basename(path)), timeout=p["timeout"])
            result["pushed"] = len(files)
        done = _call(transport, dict(request, action="install"), p)
    except TransportError as exc:
        raise ModuleFailure(str(exc))
    except ValueError as exc:
        raise ModuleFailure(str(exc))
    result.update(changed=done["changed"], installed=done["installed"], pruned=done["pruned"],
                  adopted=done.get("adopted"), timings=done.get("timings", {}))
    return result
