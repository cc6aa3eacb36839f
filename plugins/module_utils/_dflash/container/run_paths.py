# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Where a run may live, and what its env may not set. Checked on the controller (run_config.build_request) and
again inside the container (run_lifecycle, on the real path), before anything is created or stopped."""

import os
import posixpath

# A runs root (or run directory) must be a directory of its own: a lifecycle would create <root>/<run>/ and
# <root>/.dflash-lifecycle.lock in it, and a log rotation there must never touch the system's files.
SYSTEM_DIRS = frozenset(("/", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/dev", "/proc", "/sys",
                         "/run", "/var", "/root"))
# Set by the lifecycle for the trainer; a run's env setting them would make launch.json and the trainer disagree.
RESERVED_ENV = ("DFLASH_RUN_DIR", "DFLASH_RUN_NAME")
LAUNCH_REASON_ENV = "DFLASH_LAUNCH_REASON"  # set by the lifecycle at each launch (a run's env setting it is replaced)


def check_not_system_dir(path, what, real=False):
    """path (normalized) unless it is / or a top-level system directory itself; real=True also resolves links."""
    norm = posixpath.normpath(path)
    plain = "/" + norm.lstrip("/")  # normpath keeps a leading // (POSIX), which is / all the same
    for candidate in ((plain, os.path.realpath(plain)) if real else (plain,)):
        if candidate in SYSTEM_DIRS:
            raise ValueError("%s %s%s is a system directory; give the runs a directory of their own "
                             "(e.g. dflash_runs_root=/workspace/runs)"
                             % (what, path, "" if candidate == plain else " (-> %s)" % candidate))
    return norm


def check_reserved_env(*envs):
    """Refuse DFLASH_RUN_DIR / DFLASH_RUN_NAME in a run's env or secret_env: the lifecycle sets them."""
    for env in envs:
        clash = sorted(set(env or {}) & set(RESERVED_ENV))
        if clash:
            raise ValueError("the run's env sets %s, which the lifecycle sets itself (the run directory is "
                             "<runs_root>/<run>); remove it from the run's env and set dflash_runs_root instead"
                             % ", ".join(clash))
