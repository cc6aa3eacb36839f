# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""How far a staging's copy is, in a small JSON file the role reads while the module runs (roles/model_weights runs
it with async and polls): bytes copied of the total, MB/s since the copy began, the phase. The trainer's install
(trainer_install.py, roles/trainer) keeps its phase in one too (no bytes). Runs INSIDE the container.

Written at most every `interval_s` seconds from the copying threads (one lock), and at each phase change; always
replaced whole (temp file + rename), so a reader sees the old or the new figures, never half a file."""

import json
import os
import threading
import time


class CopyProgress(object):
    def __init__(self, path, total_bytes, interval_s=1.0):
        self.path, self.total, self.interval_s = path, total_bytes, interval_s
        self.copied, self.phase = 0, "planning"
        self.started = time.time()
        self._last = 0.0
        self._lock = threading.Lock()

    def set_phase(self, phase, total_bytes=None):
        """waiting for the lock, planning, copying (with the bytes to copy), copied."""
        with self._lock:
            self.phase = phase
            if total_bytes is not None:
                self.total = total_bytes
            if phase == "copying":
                self.started = time.time()
            self._write()

    def add(self, n):
        """n more bytes copied (from any copying thread)."""
        with self._lock:
            self.copied += n
            if time.monotonic() - self._last >= self.interval_s:
                self._write()

    def discard(self):
        """A staging that failed or was refused leaves no progress file beside dest."""
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _write(self):
        self._last = time.monotonic()
        now = time.time()
        row = {"phase": self.phase, "copied_bytes": self.copied, "total_bytes": self.total,
               "mb_per_s": round(self.copied / 1e6 / max(now - self.started, 1e-6), 1), "updated_at": now}
        tmp = "%s.tmp-%d" % (self.path, os.getpid())
        try:
            with open(tmp, "w") as f:
                json.dump(row, f)
            os.replace(tmp, self.path)
        except OSError:  # progress is a courtesy: a full disk must not fail the staging for it
            pass


class NoProgress(object):
    """When the caller asked for no progress file."""

    def set_phase(self, phase, total_bytes=None):
        pass

    def add(self, n):
        pass

    def discard(self):
        pass


def progress_for(req):
    """The request's progress file (its `progress_file`), or NoProgress."""
    path = req.get("progress_file")
    return CopyProgress(path, 0) if path and not req.get("check_mode") else NoProgress()
