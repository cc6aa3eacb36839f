# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Which trainer is installed where: the install record of a virtual environment, and the launch-time check.

``<venv>/dflash-install.json`` = {version, source_hash, installed_at, ...}, written last by trainer_install.py.
Stdlib only: part of the package shipped into the container (see controller/lifecycle_shipping.py).
"""

import json
import os
import re
import shutil

RECORD_NAME = "dflash-install.json"
INSTALL_HINT = "run playbooks/install_trainer.yml"


class TrainerRefused(ValueError):
    """The trainer command cannot be launched; rc is what a shell would have said (127 missing, 126 not runnable)."""

    def __init__(self, msg, rc):
        ValueError.__init__(self, msg)
        self.rc = rc


def read_record(venv):
    try:
        with open(os.path.join(venv, RECORD_NAME)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def version_tuple(text):
    """The release part of a version (``0.1.0rc1`` → (0, 1)), trailing zeros dropped; None when there is none."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text or ""))
    if not match:
        return None
    parts = [int(x) for x in match.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def resolve_command(program, path_env, cwd):
    """Absolute path of the program the launch would execute, or None when there is none."""
    if "/" in program:
        return program if os.path.isabs(program) else os.path.join(cwd, program)
    return shutil.which(program, path=path_env)


def check_trainer(argv, path_env, cwd, expect_version=None):
    """Refuse (TrainerRefused) a command that is missing, not executable, or older than expect_version.

    The installed version is read from the record of the venv the command lives in (``<venv>/bin/<cmd>``); a
    command without a record (a hand-made or development environment) is accepted as it is.
    Returns the installed version, or None when unknown.
    """
    program = argv[0]
    path = resolve_command(program, path_env, cwd)
    if path is None or not os.path.exists(path):
        raise TrainerRefused("the trainer command %s does not exist: %s (or fix the trainer command); nothing was "
                             "stopped" % (path or program, INSTALL_HINT), 127)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise TrainerRefused("the trainer command %s is not an executable file: %s (or fix the trainer command); "
                             "nothing was stopped" % (path, INSTALL_HINT), 126)
    record = None
    for candidate in (path, os.path.realpath(path)):
        record = read_record(os.path.dirname(os.path.dirname(candidate)))
        if record is not None:
            break
    installed = (record or {}).get("version")
    if expect_version and installed is not None:
        have, want = version_tuple(installed), version_tuple(expect_version)
        if have is None or (want is not None and have < want):
            raise TrainerRefused("installed trainer %s is older than the %s this collection expects: %s; nothing "
                                 "was stopped" % (installed, expect_version, INSTALL_HINT), 126)
    return installed
