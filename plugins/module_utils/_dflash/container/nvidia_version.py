# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""NVIDIA driver versions: the host kernel module's (from /proc/driver/nvidia/version) and the user-space
libraries' (from libnvidia-ml.so.<version> file names). Pure functions, stdlib only; used on the Proxmox host
(the module) and inside the container (shipped with the in-container package).

The first line of /proc/driver/nvidia/version names the kernel module, its architecture and version:
  NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024
  NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  (dvs-builder@…)  …
"""

import re

# Proprietary ("<arch> Kernel Module") and open ("Open Kernel Module for <arch>") modules; 390/340 legacy
# branches have two-part versions (390.157).
_NVRM_RE = re.compile(
    r"NVRM version:\s+NVIDIA UNIX\s+"
    r"(?:(?P<open>Open )Kernel Module for (?P<arch_open>[A-Za-z0-9_]+)|(?P<arch>[A-Za-z0-9_]+) Kernel Module)"
    r"\s+(?P<version>\d+\.\d+(?:\.\d+)?)(?:\s|$)")
VERSION_RE = re.compile(r"\d+\.\d+(?:\.\d+)?")
_LIB_RE = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)")


class DriverVersionError(ValueError):
    """The version file exists but says something we cannot read."""


def parse_driver_version(text, source="/proc/driver/nvidia/version"):
    """{"version", "arch", "open"} of the kernel module that `text` (the version file's content) describes."""
    lines = (text or "").splitlines()
    for line in lines:
        m = _NVRM_RE.match(line.strip())
        if m:
            return {"version": m.group("version"), "arch": m.group("arch") or m.group("arch_open"),
                    "open": bool(m.group("open"))}
    first = lines[0].strip() if lines else ""
    raise DriverVersionError(
        "cannot read the NVIDIA driver version from %s: %s; expected a line like 'NVRM version: NVIDIA UNIX "
        "x86_64 Kernel Module  550.127.05  …'" % (source, "first line %r" % first[:120] if first else "it is empty"))


def installer_name(version, arch="x86_64"):
    """NVIDIA's file name of the .run installer of exactly this driver version."""
    if not VERSION_RE.fullmatch(version or ""):
        raise DriverVersionError("not an NVIDIA driver version: %r" % (version,))
    return "NVIDIA-Linux-%s-%s.run" % (arch, version)


def library_version(file_name):
    """The version in a libnvidia-ml.so.<version> file name, or None (libnvidia-ml.so.1 and others)."""
    m = _LIB_RE.fullmatch(file_name)
    return m.group(1) if m else None
