# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The files the lifecycle keeps in a run directory (inside the container, stdlib only): JSON records written
atomically, the pid file, exit and stop records, earlier logs and launch records kept aside and pruned."""

import json
import os
import re
import signal
import time

LOG_NAME = "train.log"


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json_atomic(path, data):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        unlink(tmp)  # never a temp file left behind (a full disk fails the write, or the fsync)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = path  # a failed write or flush names no file by itself
        raise


def unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def read_pid(run_dir):
    try:
        with open(os.path.join(run_dir, "pid")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


EXIT_RECORD = "exit.json"  # {pid, rc}: written when the lifecycle saw the launched process exit (verify)
STOP_RECORD = "stopped.json"  # {pid, signal, waited_s, at}: written when the lifecycle stopped the run's process


def own_record(run_dir, name, pid):
    rec = read_json(os.path.join(run_dir, name))
    return rec if isinstance(rec, dict) and pid is not None and rec.get("pid") == pid else None


def record(run_dir, name, data):
    """Best effort: a record that cannot be written (full disk) must not turn a done stop into a failure."""
    try:
        write_json_atomic(os.path.join(run_dir, name), data)
    except OSError:
        pass  # write_json_atomic removed its temp file


def exit_text(rc):
    if rc is None:
        return "status unknown"
    if rc < 0:
        try:
            return "killed by %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return str(rc)


def unique_path(path):
    """path, or path with .N before its extension (train.<stamp>.1.log): kept files still match train.*.log."""
    if not os.path.exists(path):
        return path
    base, ext = os.path.splitext(path)
    n = 1
    while os.path.exists("%s.%d%s" % (base, n, ext)):
        n += 1
    return "%s.%d%s" % (base, n, ext)


def keep_previous(run_dir, now):
    """Move the previous launch's log and launch.json aside, never overwriting anything."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    kept = []
    for name, ext in ((LOG_NAME, ".log"), ("launch.json", ".json")):
        path = os.path.join(run_dir, name)
        if os.path.exists(path):
            dest = unique_path(os.path.join(run_dir, "%s.%s%s" % (name[: -len(ext)], stamp, ext)))
            os.rename(path, dest)
            kept.append(dest)
    return kept


RECORD_RE = {"train": re.compile(r"train\.(\d{8}-\d{6})(?:\.(\d+))?\.log"),
             "launch": re.compile(r"launch\.(\d{8}-\d{6})(?:\.(\d+))?\.json")}


def prune_records(run_dir, keep):
    """Remove all but the newest `keep` of train.<stamp>[.N].log and of launch.<stamp>[.N].json (each kind on its
    own); only names keep_previous makes are touched, never a checkpoint. Returns the removed paths."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    removed = []
    for pattern in RECORD_RE.values():
        found = []
        for name in names:
            m = pattern.fullmatch(name)
            if m:
                found.append(((m.group(1), int(m.group(2) or 0)), name))
        for _key, name in sorted(found, reverse=True)[keep:]:
            path = os.path.join(run_dir, name)
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


def write_pidfile(run_dir):
    # Runs in the child after setsid(), before exec: the pid on disk is the new group leader's.
    path = os.path.join(run_dir, "pid")
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, ("%d\n" % os.getpid()).encode())
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, path)


def restore(kept, run_dir):
    """Undo keep_previous when the new launch could not even start: the previous launch stays the record."""
    unlink(os.path.join(run_dir, "launch.json"))  # this launch never happened
    for path in kept:
        name = "launch.json" if os.path.basename(path).startswith("launch.") else LOG_NAME
        try:
            os.rename(path, os.path.join(run_dir, name))
        except OSError:
            pass
