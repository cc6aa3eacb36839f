# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Disk space a launch needs, checked before anything is stopped; where a run's last checkpoint is.

Where the trainer writes its checkpoints (step-N directories and a `latest` file naming the newest complete one)
and how many it keeps are the trainer's settings: its check (trainer_check.py, ``dflash-train --check``) reports
them as `checkpoints` and `keep_checkpoints`, and launch.json records `checkpoints`. The trainer writes the next
checkpoint before pruning, so keep+1 exist at its peak (a trainer that reports no keep count: room for the next
one). Part of the in-container package.
"""

import os
import re

LAUNCH_RESERVE = 1 << 20  # launch.json, pid, the log's first lines, heartbeat.json: 1 MiB is ample
STEP_DIR = re.compile(r"step-(\d+)")


def recorded_checkpoints(launch_info, run_dir):
    """Where a launched run writes its checkpoints: launch.json's `checkpoints` (the trainer's answer at launch)."""
    return (launch_info or {}).get("checkpoints") or os.path.join(run_dir, "checkpoints")


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


def space_needs(settings, run_dir):
    """[(path, bytes needed, why)]: the run directory's launch files and the next checkpoints (settings: the
    trainer check's `checkpoints` and `keep_checkpoints`)."""
    root = settings["checkpoints"]
    keep = settings.get("keep_checkpoints")
    needs = [(run_dir, LAUNCH_RESERVE, "launch %d" % LAUNCH_RESERVE)]
    newest = last_checkpoint(root)
    if newest is not None:
        size = _size(newest)
        count = max(1, keep + 1 - len(_steps(root))) if keep else 1
        needs.append((root, count * size, "%d checkpoint%s of %d estimated from %s (%s)"
                      % (count, "" if count == 1 else "s", size, newest,
                         "keep_checkpoints %d + 1" % keep if keep else "the next one")))
    return needs


def check_space(settings, run_dir):
    """Refuse (ValueError, one line) when a filesystem lacks what the launch and its checkpoints need.

    Returns {path: {"free", "needed"}} of each filesystem checked. Needs on one filesystem are added up.
    """
    by_fs = {}
    for path, needed, why in space_needs(settings, run_dir):
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
