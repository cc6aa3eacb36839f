# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Disk space a launch needs, checked before anything is stopped; where a run's last checkpoint is.

The trainer's checkpoints live in <--output-dir>/checkpoints/ (step-N directories and a `latest` file naming the
newest complete one; trainer/src/dflash_trainer/loop/checkpoint.py), or under the run directory when the command has
no --output-dir (the stand-in trainer of the tests). It keeps --keep-checkpoints of them (the trainer's default:
3) and writes the next one before pruning, so keep+1 exist at its peak. Part of the in-container package.
"""

import os
import re

LAUNCH_RESERVE = 1 << 20  # launch.json, pid, the log's first lines, heartbeat.json: 1 MiB is ample
DEFAULT_KEEP = 3  # the trainer's --keep-checkpoints default
STEP_DIR = re.compile(r"step-(\d+)")


def argv_flag(argv, name):
    """The value of --name=VALUE (or --name VALUE) in argv, else None."""
    argv = list(argv or [])
    for i, arg in enumerate(argv):
        if arg.startswith("--%s=" % name):
            return arg.split("=", 1)[1]
        if arg == "--" + name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def checkpoints_dir(argv, run_dir):
    return os.path.join(argv_flag(argv, "output-dir") or run_dir, "checkpoints")


def _steps(root):
    try:
        names = os.listdir(root)
    except OSError:
        return []
    found = []
    for name in names:
        m = STEP_DIR.fullmatch(name)
        if m and os.path.isdir(os.path.join(root, name)):
            found.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(found)


def last_checkpoint(root):
    """The checkpoint `latest` names (when it exists), else the highest step-N directory, else None."""
    try:
        with open(os.path.join(root, "latest")) as f:
            path = os.path.join(root, f.read().strip())
        if STEP_DIR.fullmatch(os.path.basename(path)) and os.path.isdir(path):
            return path
    except OSError:
        pass
    steps = _steps(root)
    return steps[-1][1] if steps else None


def _size(path):
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            total += max(st.st_size, st.st_blocks * 512)
    return total


def _existing(path):
    """path, or its nearest existing ancestor (where its files would go)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _mib(n):
    return "%.1f MiB" % (n / 1048576.0)


def space_needs(argv, run_dir):
    """[(path, bytes needed, why)]: the run directory's launch files and the next checkpoints."""
    root = checkpoints_dir(argv, run_dir)
    try:
        keep = max(1, int(argv_flag(argv, "keep-checkpoints") or DEFAULT_KEEP))
    except ValueError:
        keep = DEFAULT_KEEP
    needs = [(run_dir, LAUNCH_RESERVE, "launch %d" % LAUNCH_RESERVE)]
    newest = last_checkpoint(root)
    if newest is not None:
        size = _size(newest)
        count = max(1, keep + 1 - len(_steps(root)))
        needs.append((root, count * size, "%d checkpoint%s of %d estimated from %s (keep_checkpoints %d + 1)"
                      % (count, "" if count == 1 else "s", size, newest, keep)))
    return needs


def check_space(argv, run_dir):
    """Refuse (ValueError, one line) when a filesystem lacks what the launch and its checkpoints need.

    Returns {path: {"free", "needed"}} of each filesystem checked. Needs on one filesystem are added up.
    """
    by_fs = {}
    for path, needed, why in space_needs(argv, run_dir):
        where = _existing(path)
        dev = os.stat(where).st_dev
        entry = by_fs.setdefault(dev, {"path": path, "where": where, "needed": 0, "why": []})
        entry["needed"] += needed
        entry["why"].append(why)
    report = {}
    for entry in by_fs.values():
        st = os.statvfs(entry["where"])
        free = st.f_bavail * st.f_frsize
        report[entry["path"]] = {"free": free, "needed": entry["needed"]}
        if free < entry["needed"]:
            raise ValueError("not enough disk space in %s: %d bytes free (%s), %d needed (%s) (%s); free space there "
                             "(or lower keep_checkpoints), then run this again; nothing was stopped"
                             % (entry["path"], free, _mib(free), entry["needed"], _mib(entry["needed"]),
                                " + ".join(entry["why"])))
    return report
