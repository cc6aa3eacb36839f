# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Leftover module temp directories of interrupted plays, found and removed on the Proxmox host.

Without pipelining, Ansible copies each module with its arguments (training_run's secret_env included) into
<remote_tmp>/ansible-tmp-*/AnsiballZ_<module>.py and removes that directory when the task ends. A play cut off
mid-task (a dropped ssh connection) never removes it, so the secrets stay on the host. The next training_run
removes such directories: those holding one of our modules, not named on any live process's command line (the
module of a concurrent play runs from its directory) and older than MIN_AGE_S (the copy is made a moment before
the module starts). With pipelining the module travels on stdin and no such directory exists.
"""

from __future__ import annotations

import os
import shutil
import time

MODULE_FILES = ("AnsiballZ_training_run.py",)  # the modules that take secrets
MIN_AGE_S = 15.0


def _live_command_lines():
    lines = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    lines.append(f.read().replace(b"\0", b" ").decode("utf-8", "replace"))
            except OSError:  # a process that ended meanwhile
                pass
    return lines


def remove_leftovers(remote_tmp, now=None):
    """Removes the leftover directories under remote_tmp; returns their paths (empty when there are none)."""
    if not remote_tmp:
        return []
    root = os.path.expanduser(os.path.expandvars(remote_tmp))
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("ansible-tmp-"))
    except OSError:  # no remote tmp yet: nothing was ever left
        return []
    now = time.time() if now is None else now
    live = None
    removed = []
    for name in names:
        path = os.path.join(root, name)
        held = [f for f in MODULE_FILES if os.path.isfile(os.path.join(path, f))]
        try:
            young = now - os.stat(path).st_mtime < MIN_AGE_S
        except OSError:
            continue
        if not held or young:
            continue
        live = _live_command_lines() if live is None else live
        if any(path in line for line in live):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed
