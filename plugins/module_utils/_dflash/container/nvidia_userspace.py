# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The NVIDIA user-space driver inside the container: which version is installed, install one, ask NVML.

Executed INSIDE the container (controller/nvidia_userspace_backend.py ships it; JSON in, one JSON line out):
  detect   the versions of the libnvidia-ml.so.<version> files present (the truth: a marker alone proves
           nothing) and the marker this module wrote; with prepare=true and the wanted version missing, the
           staging directory the installer is pushed into is created
  install  run the pushed .run installer with the given flags (user space only: the container shares the
           host's kernel module), check that libnvidia-ml.so.<version> of exactly that version is now there,
           write the marker, remove the installer
  verify   NVML (libnvidia-ml.so.1 through ctypes, so no Python package is needed) lists the GPUs the
           container can open, by device minor number (/dev/nvidia<N>), and the driver version it reports
Stdlib only.
"""

import ctypes
import json
import os
import subprocess
import time

from .entry import answer
from .nvidia_version import library_version
from .run_records import read_json

LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
NVML_LIB = "libnvidia-ml.so.1"
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
OUTPUT_TAIL_LINES = 20


class UserspaceError(Exception):
    def __init__(self, msg, **facts):
        Exception.__init__(self, msg)
        self.facts = facts


def ldconfig_dirs(text):
    """Directories of libnvidia-ml in `ldconfig -p` output (a runtime may put it in /usr/local/nvidia/lib64)."""
    dirs = []
    for line in text.splitlines():
        name, _sep, path = line.partition("=>")
        path = path.strip()
        if name.strip().startswith("libnvidia-ml.so") and path.startswith("/"):
            directory = os.path.dirname(path)
            if directory not in dirs:
                dirs.append(directory)
    return dirs


def library_dirs():
    """The distributions' library directories, then wherever the dynamic linker's cache finds libnvidia-ml."""
    try:
        text = subprocess.run(["ldconfig", "-p"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=30, check=False).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        text = ""
    return list(LIB_DIRS) + [d for d in ldconfig_dirs(text) if d not in LIB_DIRS]


def installed_versions(lib_dirs=None):
    """Sorted versions of every libnvidia-ml.so.<version> file in lib_dirs (default: library_dirs())."""
    found = set()
    for directory in lib_dirs or library_dirs():
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        found.update(v for v in map(library_version, names) if v)
    return sorted(found)


def detect(req):
    versions = installed_versions(req.get("lib_dirs"))
    out = {"installed_versions": versions, "up_to_date": req["version"] in versions,
           "marker": read_json(req["marker"])}
    if req.get("prepare") and not out["up_to_date"]:
        os.makedirs(req["staging_dir"], mode=0o700, exist_ok=True)
        out["staging"] = req["staging_dir"]
    return out


def _write_marker(path, record):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def _tail(text):
    return [line for line in text.splitlines() if line.strip()][-OUTPUT_TAIL_LINES:]


def install(req):
    installer = os.path.join(req["staging_dir"], req["installer"])
    if not os.path.isfile(installer):
        raise UserspaceError("%s was not pushed into the container: run this again" % installer)
    env = dict(os.environ, TMPDIR=req["staging_dir"])  # makeself unpacks into TMPDIR; /tmp may be small
    t0 = time.monotonic()
    try:
        proc = subprocess.run(["sh", installer] + list(req["installer_args"]), cwd=req["staging_dir"], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=req.get("installer_timeout"), check=False)
    except subprocess.TimeoutExpired:
        raise UserspaceError("%s did not finish within %ss: see /var/log/nvidia-installer.log in the container"
                             % (req["installer"], req.get("installer_timeout")))
    finally:
        try:
            os.unlink(installer)  # hundreds of MB; a re-run pushes it again
        except OSError:
            pass
    seconds = round(time.monotonic() - t0, 3)
    output = _tail(proc.stdout.decode("utf-8", "replace"))
    if proc.returncode != 0:
        raise UserspaceError("%s %s failed (exit %s): %s; see /var/log/nvidia-installer.log in the container"
                             % (req["installer"], " ".join(req["installer_args"]), proc.returncode,
                                output[-1] if output else "no output"), installer_output=output)
    versions = installed_versions(req.get("lib_dirs"))
    if req["version"] not in versions:
        raise UserspaceError("%s exited 0 but left no libnvidia-ml.so.%s (found: %s): is it the installer of "
                             "driver %s?" % (req["installer"], req["version"], ", ".join(versions) or "none",
                                             req["version"]), installer_output=output)
    _write_marker(req["marker"], {"version": req["version"], "installer": req["installer"],
                                  "installer_args": list(req["installer_args"]), "installed_at": time.time()})
    return {"installed": True, "installed_versions": versions, "install_s": seconds, "installer_output": output}


def _nvml_call(nvml, name, *args):
    rc = getattr(nvml, name)(*args)
    if rc != 0:
        nvml.nvmlErrorString.restype = ctypes.c_char_p
        raise UserspaceError("%s: %s" % (name, (nvml.nvmlErrorString(rc) or b"error %d" % rc).decode()), nvml_rc=rc)


def nvml_gpus(lib=NVML_LIB):
    """{"driver_version", "gpus": [{index, minor, name, uuid}], "inaccessible": [{index, error}]} from NVML."""
    try:
        nvml = ctypes.CDLL(lib)
    except OSError as exc:
        raise UserspaceError("NVML cannot be loaded in the container (%s): the user-space driver is missing or "
                             "broken" % exc)
    try:
        _nvml_call(nvml, "nvmlInit_v2")
    except UserspaceError as exc:
        if exc.facts.get("nvml_rc") == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
            raise UserspaceError("NVML in the container does not match the host's kernel module (%s): install the "
                                 "user-space driver of the host's version" % exc)
        raise UserspaceError("NVML could not start in the container (%s): are /dev/nvidiactl and the GPUs passed "
                             "through?" % exc)
    try:
        buf = ctypes.create_string_buffer(96)
        _nvml_call(nvml, "nvmlSystemGetDriverVersion", buf, ctypes.c_uint(96))
        out = {"driver_version": buf.value.decode(), "gpus": [], "inaccessible": []}
        count = ctypes.c_uint()
        _nvml_call(nvml, "nvmlDeviceGetCount_v2", ctypes.byref(count))
        for index in range(count.value):
            handle, minor = ctypes.c_void_p(), ctypes.c_uint()
            name, uuid = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
            try:
                _nvml_call(nvml, "nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
                _nvml_call(nvml, "nvmlDeviceGetMinorNumber", handle, ctypes.byref(minor))
                _nvml_call(nvml, "nvmlDeviceGetName", handle, name, ctypes.c_uint(96))
                _nvml_call(nvml, "nvmlDeviceGetUUID", handle, uuid, ctypes.c_uint(96))
            except UserspaceError as exc:  # a GPU whose device file the container may not open
                out["inaccessible"].append({"index": index, "error": str(exc)})
                continue
            out["gpus"].append({"index": index, "minor": minor.value, "name": name.value.decode(),
                                "uuid": uuid.value.decode()})
        return out
    finally:
        nvml.nvmlShutdown()


def verify(req):
    seen = nvml_gpus(req.get("nvml_lib") or NVML_LIB)
    minors = sorted(g["minor"] for g in seen["gpus"])
    expected = sorted(set(req.get("expected_gpus") or []))
    missing = [i for i in expected if i not in minors]
    if seen["driver_version"] != req["version"]:
        raise UserspaceError("NVML in the container reports driver %s, the host's kernel module is %s"
                             % (seen["driver_version"], req["version"]), **seen)
    if missing:
        raise UserspaceError("NVML in the container lists GPUs %s (/dev/nvidia<N> minors), not %s: pass "
                             "/dev/nvidia%s through to the container (proxmox_lxc role)"
                             % (minors, missing, ",".join(map(str, missing))), **seen)
    seen.update(minors=minors, unexpected=[m for m in minors if expected and m not in expected])
    return seen


ACTIONS = {"detect": detect, "install": install, "verify": verify}


def _handle(req):
    if req.get("action") not in ACTIONS:
        raise UserspaceError("unknown action %r" % req.get("action"))
    return ACTIONS[req["action"]](req)


def main(req):
    answer(_handle, req, (UserspaceError,), "nvidia user-space error")
