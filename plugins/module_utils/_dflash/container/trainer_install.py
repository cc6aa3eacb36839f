# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Install the trainer wheel into a NEW venv inside the container, prove it runs, then switch the link to it.

Executed INSIDE the container (controller/trainer_install_backend.py ships it; JSON in, one JSON line out):
  plan     what an install would do (nothing changes; with prepare=true the staging directory is created)
  install  venv <venvs_root>/<key> → pip install (wheel + pins) → `<venv>/bin/dflash-train --help` → record →
           switch the link → prune old venvs. Any failure removes the half-built venv and leaves the link where
           it was, so the previous trainer keeps working.
Stdlib only.
"""

import json
import os
import subprocess
import sys
import time
import zipfile

from . import trainer_venvs as venvs
from .entry import answer
from .file_digest import sha256_file
from .file_lock import FileLock
from .trainer_record import RECORD_NAME
from .weights_progress import progress_for

STAGING_PREFIX = ".staging-"
LOCK_NAME = ".install.lock"
VERIFY_COMMAND = "dflash-train"


class InstallError(Exception):
    def __init__(self, msg, **facts):
        Exception.__init__(self, msg)
        self.facts = facts


def staging_dir(req):
    return os.path.join(req["venvs_root"], STAGING_PREFIX + req["key"])


def plan(req):
    """Facts and decisions, nothing changed: is the key current, can a kept venv be reused, what is pruned."""
    key, root, link = req["key"], req["venvs_root"], req["link"]
    target = os.path.join(root, key)
    cur = venvs.current(link)
    up_to_date = cur["kind"] == "symlink" and cur["target"] == os.path.realpath(target) and \
        venvs.is_complete(target, key)
    out = {"key": key, "venv": target, "link": link, "link_kind": cur["kind"], "previous": cur["target"],
           "up_to_date": up_to_date, "reusable": not up_to_date and venvs.is_complete(target, key),
           "adopt": cur["kind"] == "directory"}
    if cur["kind"] == "other":
        raise InstallError("%s exists and is neither a directory nor a symlink: move it away, then run this "
                           "again" % link)
    # The previous environment (adopted or not) and the new one are kept; both count against keep.
    out["would_prune"] = venvs.prunable(root, req["keep"], [cur["target"], target])
    out["changed"] = not up_to_date or bool(out["would_prune"])
    if req.get("prepare") and not up_to_date and not out["reusable"] and not req.get("check_mode"):
        os.makedirs(staging_dir(req), exist_ok=True)
        out["staging"] = staging_dir(req)
    return out


def _run(argv, timeout, what):
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, env=_clean_env(), check=False)
    except subprocess.TimeoutExpired:
        raise InstallError("%s did not finish within %ss" % (what, timeout))
    except OSError as exc:
        raise InstallError("%s could not run: %s" % (what, exc))
    output = proc.stdout.decode("utf-8", "replace").splitlines()
    if proc.returncode != 0:
        last = next((line.strip() for line in reversed(output) if line.strip()), "no output")
        raise InstallError("%s failed (exit %s): %s" % (what, proc.returncode, last), output_tail=output[-30:])
    return output


def _clean_env():
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "HOME": os.environ.get("HOME", "/root")}
    return env


def pip_argv(venv, req, wheel):
    argv = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--no-cache-dir", "--quiet"]
    if not req.get("compile_bytecode", True):
        # pip byte-compiles every installed file (most of its CPU time for torch); skipped, Python compiles what
        # the trainer imports at its first start instead
        argv += ["--no-compile"]
    if req.get("no_index"):
        argv += ["--no-index"]  # offline: the staged wheel(s) and the wheelhouse only
    elif req.get("index_url"):
        argv += ["--index-url", req["index_url"]]
    for path in req.get("find_links") or []:
        argv += ["--find-links", path]
    # Pins are requirement specifiers (the controller refused anything that looks like an option).
    return argv + [wheel] + list(req.get("pins") or [])


def build(req, venv, wheel):
    """python -m venv + pip install + verify + record; raises InstallError (the caller removes venv)."""
    timings, progress = {}, req["progress"]
    t0 = time.monotonic()
    progress.set_phase("creating the venv")
    _run([sys.executable, "-m", "venv", venv], 300, "python3 -m venv %s" % venv)
    timings["venv"] = round(time.monotonic() - t0, 3)
    t0 = time.monotonic()
    progress.set_phase("pip install of the trainer and %d pins" % len(req.get("pins") or []))
    _run(pip_argv(venv, req, wheel), req["pip_timeout"], "pip install of the trainer")
    timings["pip"] = round(time.monotonic() - t0, 3)
    t0 = time.monotonic()
    progress.set_phase("verifying")
    _run([os.path.join(venv, "bin", VERIFY_COMMAND), "--help"], 300, "%s/bin/%s --help" % (venv, VERIFY_COMMAND))
    timings["verify"] = round(time.monotonic() - t0, 3)
    record = {"version": req["version"], "source_hash": req["source_hash"], "wheel_sha256": req["wheel_sha256"],
              "pins": req.get("pins") or [], "installed_at": time.time()}
    tmp = os.path.join(venv, RECORD_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(venv, RECORD_NAME))
    return timings


def install(req):
    req.setdefault("progress", progress_for(req))
    decided = plan(dict(req, prepare=False))
    result = dict(decided, changed=False, installed=False, pruned=[], adopted=None)
    if decided["up_to_date"]:
        return _prune(req, result, decided)
    venv, staging = decided["venv"], staging_dir(req)
    try:
        if not decided["reusable"]:
            req["progress"].set_phase("checking the wheel")
            wheel = os.path.join(staging, req["wheel_name"])
            if not os.path.isfile(wheel):
                raise InstallError("the trainer wheel was not copied to %s: run this again" % wheel)
            if sha256_file(wheel) != req["wheel_sha256"]:
                raise InstallError("the copied wheel %s does not match its sha256 (a truncated copy?): run this "
                                   "again" % wheel)
            if not zipfile.is_zipfile(wheel):
                raise InstallError("%s is not a wheel (not a zip archive): rebuild it, then run this again" % wheel)
            venvs.remove(venv)  # a half-built one left by a killed install
            try:
                result["timings"] = build(req, venv, wheel)
            except BaseException:
                venvs.remove(venv)
                raise
            result["installed"] = True
        t0 = time.monotonic()
        req["progress"].set_phase("switching %s" % req["link"])
        if decided["adopt"]:
            result["adopted"] = venvs.adopt(req["link"], req["venvs_root"], time.time())
        venvs.switch(req["link"], venv)
        result.setdefault("timings", {})["switch"] = round(time.monotonic() - t0, 3)
    finally:
        venvs.remove(staging)
    result["changed"] = True
    return _prune(req, result, decided)


def _prune(req, result, decided):
    protect = [decided["venv"], result.get("adopted") or decided["previous"]]
    result["pruned"] = venvs.prunable(req["venvs_root"], req["keep"], protect)
    for path in result["pruned"]:
        venvs.remove(path)
    result["changed"] = result["changed"] or bool(result["pruned"])
    return result


def _install_busy(path, waited_s):
    return InstallError("another trainer install in this container held %s for %ss; wait for it to finish (or raise "
                        "pip_timeout)" % (path, waited_s))


def _handle(req):
    if req["action"] == "plan":
        return plan(req)
    if req["action"] != "install":
        raise InstallError("unknown action %r" % req["action"])
    os.makedirs(req["venvs_root"], exist_ok=True)
    req["progress"] = progress_for(req)  # the role follows it while this runs (async)
    req["progress"].set_phase("waiting for another install")
    # One install per container at a time (released when this process ends, also when it is killed). Another
    # install's pip is bounded by pip_timeout, so waiting that long for it says it is stuck.
    with FileLock(os.path.join(req["venvs_root"], LOCK_NAME), req["pip_timeout"], _install_busy, poll_s=0.5):
        req["progress"].set_phase("planning")
        return install(req)


def main(req):
    answer(_handle, req, (InstallError,), "trainer install error")
