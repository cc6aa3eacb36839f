# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""An exclusive lock on a file (flock), waited for up to a timeout; the kernel releases it if the holder dies."""

import errno
import fcntl
import os
import time


class FileLock(object):
    """`with FileLock(path, timeout_s, busy):` — busy(path, timeout_s) builds the exception raised on timeout."""

    def __init__(self, path, timeout_s, busy, poll_s=0.05):
        self.path, self.timeout_s, self.busy, self.poll_s = path, timeout_s, busy, poll_s
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(self.fd)
                    raise
            if time.monotonic() > deadline:
                os.close(self.fd)
                raise self.busy(self.path, self.timeout_s)
            time.sleep(self.poll_s)

    def __exit__(self, *exc):
        os.close(self.fd)
