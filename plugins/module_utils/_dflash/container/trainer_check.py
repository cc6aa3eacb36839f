# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The installed trainer's own check of a configuration (``dflash-train --check``), run before anything is stopped.

The trainer owns its rules (which flags exist, their defaults, the torchrun layout of a process count, where its
checkpoints go and how many it keeps): the lifecycle asks it and keeps no copy. The check runs the run's own
command with ``--check`` before the flags, the run's environment (secrets left out: no check reads them) and, for a
torchrun job, WORLD_SIZE = its process count, as each rank would see it. It answers one JSON line,
{"check": "ok"|"failed", "problems", "layout", "settings"}, on stdout. Part of the in-container package (stdlib).
"""

import json
import os
import subprocess

CHECK_FLAG = "--check"


class CheckRefused(ValueError):
    """The trainer refused the configuration (or did not answer): one line with its problems."""


def check_argv(command, trainer_flags):
    """The run's command with --check before its flags (a console script or ``python -m dflash_trainer.cli``)."""
    return list(command) + [CHECK_FLAG] + list(trainer_flags)


def _report(stdout):
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and "check" in doc:
                return doc
    return None


def _one_line(text):
    return " ".join(str(text).split())


def run_check(argv, env, cwd, timeout):
    """The trainer's report of argv (--check already in it), or CheckRefused naming every problem it printed."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env, cwd=cwd, timeout=timeout, close_fds=True, start_new_session=True, check=False)
    except subprocess.TimeoutExpired:
        raise CheckRefused("the trainer's check (%s %s) did not answer within %ss; raise heartbeat_timeout if the "
                           "trainer is slow to import here" % (argv[0], CHECK_FLAG, timeout))
    except OSError as exc:
        raise CheckRefused("the trainer's check could not run %s: %s" % (argv[0], exc.strerror or exc))
    stdout = proc.stdout.decode("utf-8", "replace")
    stderr = proc.stderr.decode("utf-8", "replace")
    report = _report(stdout)
    if proc.returncode == 0 and report is not None and report.get("check") == "ok":
        return report
    problems = [_one_line(p) for p in (report or {}).get("problems") or []]
    if not problems:  # no report: the trainer's own last lines (an older trainer without --check says so there)
        lines = [_one_line(x) for x in stderr.splitlines() if x.strip()]
        problems = lines[-3:] or ["exit status %s and no report on stdout" % proc.returncode]
        if any(CHECK_FLAG in x for x in problems):
            problems.append("the installed trainer has no %s: run playbooks/install_trainer.yml" % CHECK_FLAG)
    raise CheckRefused("; ".join(problems))


def collection_layout(layout, over_nodes=False):
    """launch.json's job layout from the trainer's: [{rank, role, gpu[, gpus][, node]}] (gpu None on the CPU; node,
    for a job over nodes: the trainer's answer, None from a trainer that does not say)."""
    if not layout:
        return None
    rows = []
    for entry in layout:
        devices = entry.get("devices") or [entry.get("device")]
        gpus = [int(d.split(":", 1)[1]) for d in devices if str(d).startswith("cuda:")]
        row = {"rank": entry["rank"], "role": entry["role"], "gpu": gpus[0] if gpus else None}
        if over_nodes:
            row["node"] = entry.get("node")
        if len(gpus) > 1:
            row["gpus"] = gpus
        rows.append(row)
    return rows


def check_cwd(req):
    """Where the check runs: the launch's cwd (or run directory) once it exists, else the runs root, else /."""
    for path in (req.get("cwd"), req["run_dir"], req["runs_root"]):
        if path and os.path.isdir(path):
            return path
    return "/"
