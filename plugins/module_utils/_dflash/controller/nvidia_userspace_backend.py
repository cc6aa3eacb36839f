# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Backend of the nvidia_userspace module. Runs on the Proxmox host (the managed host): reads the host's driver
version there, then detect (one transport call) → push the installer → install (one call) → verify (one call).

Uses only module.params, module.check_mode and module._diff, so tests can pass a small stand-in.
"""

from __future__ import annotations

import os
import posixpath
import socket

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec
from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.nvidia_version import (
    DriverVersionError, installer_name, parse_driver_version)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.lifecycle_shipping import (
    call_in_container)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport.command import (
    Transport, TransportError, transport_argument_spec)

# User space only, no prompts (see the module's documentation for each flag's reason).
INSTALLER_ARGS = ["--no-kernel-module", "--no-drm", "--no-nouveau-check", "--no-x-check", "--silent",
                  "--no-questions", "--ui=none"]
KERNEL_MODULE_OFF = ("--no-kernel-module", "--no-kernel-modules")


def argument_spec():
    """nvidia_userspace's options: the only place their defaults are declared (the docs are checked against it)."""
    own = ArgumentSpec(
        argument_spec=dict(
            host_version_file=dict(type="path", default="/proc/driver/nvidia/version"),
            installer_dir=dict(type="path", default="/var/lib/dflash/nvidia"),
            installer_args=dict(type="list", elements="str", default=list(INSTALLER_ARGS)),
            staging_dir=dict(type="path", default="/var/tmp/dflash-nvidia"),
            marker=dict(type="path", default="/etc/dflash/nvidia-userspace.json"),
            expected_gpus=dict(type="list", elements="int", default=[]),
            verify=dict(type="bool", default=True),
            python=dict(type="str"),
            timeout=dict(type="float", default=1800),
        ),
    )
    return transport_argument_spec().merge(own)


def host_driver(path):
    """The host kernel module's {version, arch, open}, or None when the file does not exist (no driver)."""
    try:
        with open(path) as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ModuleFailure("cannot read %s on the host: %s" % (path, exc.strerror))
    try:
        return parse_driver_version(text, source=path)
    except DriverVersionError as exc:
        raise ModuleFailure(str(exc))


def _check_params(p):
    if not any(arg in KERNEL_MODULE_OFF for arg in p["installer_args"]):
        raise ModuleFailure("installer_args must contain --no-kernel-module: a container shares the host's kernel "
                            "module and cannot build or load its own")
    for key in ("staging_dir", "marker"):
        if not p[key].startswith("/") or p[key].rstrip("/") in ("", "/tmp"):
            raise ModuleFailure("%s must be an absolute path of its own (not / or /tmp), got %r" % (key, p[key]))
    if any(i < 0 for i in p["expected_gpus"]):
        raise ModuleFailure("expected_gpus are /dev/nvidia<N> numbers (0 or more), got %s" % p["expected_gpus"])


def _call(transport, p, request):
    return call_in_container(transport, p, request, "nvidia_userspace",
                             "NVIDIA user space in %s" % transport.describe())


def ensure_userspace(module):
    p = module.params
    _check_params(p)
    try:
        transport = Transport.from_params(p)
    except ValueError as exc:
        raise ModuleFailure(str(exc))
    driver = host_driver(p["host_version_file"])
    if driver is None:
        msg = "no NVIDIA driver on %s: nothing to install (CPU container)" % socket.gethostname()
        return {"changed": False, "skipped": True, "msg": msg, "skip_reason": msg, "host_version": None,
                "host_version_file": p["host_version_file"]}
    version = driver["version"]
    name = installer_name(version, driver["arch"])
    installer = os.path.join(p["installer_dir"], name)
    request = {"version": version, "installer": name, "staging_dir": p["staging_dir"], "marker": p["marker"],
               "installer_args": p["installer_args"], "installer_timeout": p["timeout"],
               "expected_gpus": p["expected_gpus"]}
    result = {"host_version": version, "host_module": "open" if driver["open"] else "proprietary",
              "installer": installer, "installer_args": p["installer_args"], "installed": False,
              "installer_present": os.path.isfile(installer)}
    try:
        prepare = result["installer_present"] and not module.check_mode  # the push needs its directory
        found = _call(transport, p, dict(request, action="detect", prepare=prepare))
        result.update(changed=not found["up_to_date"], installed_versions=found["installed_versions"],
                      previous_versions=found["installed_versions"])
        if getattr(module, "_diff", False):
            result["diff"] = {"before": {"versions": found["installed_versions"]},
                              "after": {"versions": [version] if result["changed"] else found["installed_versions"]}}
        if result["changed"] and not result["installer_present"] and not module.check_mode:
            raise ModuleFailure("the installer of driver %s is not there: put %s on the Proxmox host (or set "
                                "installer_dir), then run this again" % (version, installer), **_facts(result))
        if module.check_mode:
            return result
        if result["changed"]:
            transport.push(installer, posixpath.join(found["staging"], name), timeout=p["timeout"])
            done = _call(transport, p, dict(request, action="install"))
            result.update(installed=True, installed_versions=done["installed_versions"],
                          install_s=done["install_s"], installer_output=done["installer_output"])
        if p["verify"]:
            result["nvml"] = _call(transport, p, dict(request, action="verify"))
        else:
            result["verify_note"] = ("NVML verification skipped (verify=false): the driver is a stand-in or the "
                                     "GPUs are checked elsewhere")
    except TransportError as exc:
        raise ModuleFailure(str(exc), **_facts(result))
    return result


def _facts(result):
    return {k: v for k, v in result.items() if k not in ("changed", "diff")}
