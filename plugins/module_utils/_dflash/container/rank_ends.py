# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""How each rank of a torchrun job ended, and which failed first (stdlib only; shipped into the container).

A rank that fails through its own error writes <ranks dir>/<rank>.end.json {rank, role, pid, rc, error, at}
on the way out (trainer: distributed/dist_train.py) and removes its pid file. A rank killed by a signal writes
nothing: its pid file stays while its process is gone. The torchrun agent's own view (its log: the failures'
exit codes by pid, and the pids it sent a closing signal to while ending the job) gives such a rank's exit code.
The first cause is a rank killed from outside (gone without an end file, and not one the agent closed) before any
rank's own error: a peer's broken connection is its consequence; else the earliest error. Ranks all gone without
a word while the agent logged no failure died with their agent (PR_SET_PDEATHSIG): no rank is named then.
"""

import os
import re

from .job_ranks import rank_files
from .plain_text import plain
from .run_records import exit_text, read_json, unlink, write_json_atomic

END_SUFFIX = ".end.json"
# torchrun's summary of a failed job: "rank : 2 (local_rank: 2)" then "exitcode : -9 (pid: 1226)"
AGENT_FAILURE = re.compile(r"exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
AGENT_FIRST = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: \d+ \(pid: (\d+)\)")
AGENT_CLOSED = re.compile(r"Sending process (\d+) closing signal")


def end_path(directory, rank):
    return os.path.join(directory, "%d%s" % (rank, END_SUFFIX))


def read_ends(directory):
    """{rank: end record} of the end files present."""
    found = {}
    for rank, path in rank_files(directory, END_SUFFIX):
        rec = read_json(path)
        if isinstance(rec, dict):
            found[rank] = rec
    return found


def agent_view(log_path):
    """({pid: exit code} of the failures torchrun's agent logged, {pids it closed}) from the run's log tail."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return {}, set()
    exits = dict((int(pid), int(rc)) for rc, pid in AGENT_FAILURE.findall(text) + AGENT_FIRST.findall(text))
    return exits, set(int(pid) for pid in AGENT_CLOSED.findall(text))


def retire_stale(directory, rows, log_path):
    """The pid files of ranks whose process is gone (or is another process now): each becomes an end file
    (`killed`: it wrote none itself; its exit code as the agent logged it, if it did) and the pid file goes, so
    that status stops listing it as a rank while the cause stays known. Called once the agent is gone."""
    exits, closed = agent_view(log_path)
    ends = read_ends(directory)
    for row in rows:
        if row["alive"]:
            continue
        if row["rank"] not in ends:
            try:
                write_json_atomic(end_path(directory, row["rank"]), {
                    "rank": row["rank"], "role": row.get("role"), "pid": row["pid"], "rc": exits.get(row["pid"]),
                    "killed": True, "closed_by_agent": row["pid"] in closed, "seen_by": "status"})
            except OSError:
                continue  # a full disk: the pid file stays, and with it what is known
        unlink(os.path.join(directory, "%d.pid" % row["rank"]))


def first_failure(directory, rows, log_path):
    """{rank, role, pid, rc, exit, error?} of the rank that failed first, or None when no rank failed."""
    exits, closed = agent_view(log_path)
    ends = read_ends(directory)
    killed = []
    for row in rows:  # pid files of gone ranks: killed without a word
        if not row["alive"] and row["rank"] not in ends:
            killed.append({"rank": row["rank"], "role": row.get("role"), "pid": row["pid"],
                           "rc": exits.get(row["pid"]), "killed": True, "closed_by_agent": row["pid"] in closed})
    killed += [dict(e, rank=r) for r, e in ends.items() if e.get("killed")]
    outside = sorted((k for k in killed if not k.get("closed_by_agent")), key=lambda k: k["rank"])
    if len(outside) > 1 and not exits:  # all gone at once and the agent logged no failure: they died with it
        outside = []
    own = sorted((dict(e, rank=r) for r, e in ends.items() if not e.get("killed")),
                 key=lambda e: (e.get("at") or 0, e["rank"]))
    pick = (outside or own or [None])[0]
    if pick is None:
        return None
    out = {"rank": pick["rank"], "role": pick.get("role"), "pid": pick.get("pid"), "rc": pick.get("rc")}
    rc = pick.get("rc")
    if rc is None:
        out["exit"] = "gone without an error of its own (killed?)" if pick.get("killed") else "failed"
    else:
        out["exit"] = exit_text(rc) if rc < 0 else "exited with status %d" % rc
    if pick.get("error"):
        out["error"] = plain(pick["error"], 400)
    return out


def describe_rank(first):
    """'rank 2 drafter (pid 1226) killed by SIGKILL' (its own error after ': ' when it raised one)."""
    if not first:
        return ""
    who = "rank %s%s (pid %s)" % (first["rank"], " %s" % first["role"] if first.get("role") else "", first["pid"])
    return "%s %s%s" % (who, first["exit"], ": %s" % first["error"] if first.get("error") else "")
