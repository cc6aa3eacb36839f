# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The trainer's virtual environments side by side: ``<venvs_root>/<key>/``, and the link that names the current one.

``link`` (``/opt/dflash/venv``) is a symlink to one of them, switched atomically (a temporary symlink renamed over
it). A real directory found at ``link`` (a hand-made venv) is adopted once: renamed to ``<venvs_root>/adopted-<stamp>``
and replaced by a symlink to it; its scripts keep working, their ``#!/opt/dflash/venv/bin/python`` now resolves
through the link (where the file system cannot rename it - overlayfs - it is copied, then removed). Stdlib only:
shipped into the container (controller/lifecycle_shipping.py).
"""

import errno
import os
import shutil
import time

from .trainer_record import read_record

ADOPTED_PREFIX = "adopted-"


def current(link):
    """{kind: symlink|directory|missing|other, target: resolved venv path or None}."""
    if os.path.islink(link):
        return {"kind": "symlink", "target": os.path.realpath(link)}
    if os.path.isdir(link):
        return {"kind": "directory", "target": os.path.realpath(link)}
    return {"kind": "other" if os.path.lexists(link) else "missing", "target": None}


def is_complete(venv, key):
    """A venv whose install finished: its record (written last) names this key."""
    record = read_record(venv)
    return record is not None and record.get("source_hash", "")[:len(key)] == key and \
        os.path.isfile(os.path.join(venv, "bin", "python"))


def adopt(link, venvs_root, now):
    """Move a real directory at link into venvs_root; return its new path (the link is absent until switch())."""
    base = os.path.join(venvs_root, ADOPTED_PREFIX + time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)))
    dest, n = base, 1
    while os.path.lexists(dest):
        dest, n = "%s.%d" % (base, n), n + 1
    try:
        os.rename(link, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        # overlayfs (a snapshot-cloned container) cannot rename a directory of its lower layer: copy, then remove.
        tmp = dest + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(link, tmp, symlinks=True)
        os.rename(tmp, dest)
        shutil.rmtree(link)
    return dest


def switch(link, target):
    """Point link at target atomically: a new symlink beside it, renamed over it (rename(2) replaces a symlink)."""
    tmp = "%s.tmp.%d" % (link, os.getpid())
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.rename(tmp, link)
    parent = os.open(os.path.dirname(link) or ".", os.O_RDONLY)
    try:
        os.fsync(parent)
    finally:
        os.close(parent)


def environments(venvs_root):
    """[(installed_at, path)] of the venvs under venvs_root, oldest first (staging and temp entries left out)."""
    found = []
    try:
        names = os.listdir(venvs_root)
    except OSError:
        return found
    for name in names:
        path = os.path.join(venvs_root, name)
        if name.startswith(".") or os.path.islink(path) or not os.path.isdir(path):
            continue
        if not os.path.exists(os.path.join(path, "pyvenv.cfg")):
            continue
        record = read_record(path) or {}
        try:
            stamp = float(record.get("installed_at") or os.stat(path).st_mtime)
        except (TypeError, ValueError, OSError):
            stamp = 0.0
        found.append((stamp, path))
    return sorted(found)


def prunable(venvs_root, keep, protect):
    """Venvs beyond the newest `keep`, never one in `protect` (the new one and the previous one: a running trainer
    may still use it). Protected ones count against keep."""
    protect = set(os.path.realpath(p) for p in protect if p)
    others = [path for _stamp, path in environments(venvs_root) if os.path.realpath(path) not in protect]
    room = max(0, keep - len(protect))
    return others[:max(0, len(others) - room)]


def remove(path):
    shutil.rmtree(path, ignore_errors=True)
