# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Copy files while hashing them (one read of the source), several at a time. Runs INSIDE the container.

Reads and writes release the GIL, and so do hashlib and xxhash on large buffers, so threads copy shards in
parallel. A source file that changes while it is copied (size or mtime) fails the copy: a half-old, half-new
shard must never be staged.
"""

import os
import threading

from .weights_manifest import BUF_BYTES, new_hasher

COPY_MODE = 0o444  # staged weights are immutable; versions share them through hard links


class SourceChanged(Exception):
    pass


def copy_hashing(src, dst, algorithm, expect, abort):
    """Copy src to the new file dst; return its content hash. expect = {size, mtime_ns} seen by the plan."""
    h = new_hasher(algorithm)
    buf = bytearray(BUF_BYTES)
    view = memoryview(buf)
    done = 0
    with open(src, "rb", buffering=0) as fin:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            while True:
                if abort.is_set():
                    raise InterruptedError("aborted")
                n = fin.readinto(buf)
                if not n:
                    break
                chunk = view[:n]
                h.update(chunk)
                written = 0
                while written < n:
                    written += os.write(fd, chunk[written:])
                done += n
            st = os.fstat(fin.fileno())
        finally:
            os.close(fd)
    if done != expect["size"] or st.st_size != expect["size"] or st.st_mtime_ns != expect["mtime_ns"]:
        raise SourceChanged("source file %s changed while it was copied (%d bytes read, %d expected); re-run when "
                            "the model store is no longer being written" % (src, done, expect["size"]))
    os.chmod(dst, COPY_MODE)
    return h.hexdigest()


def run_parallel(jobs, threads):
    """Run [(key, fn)] on up to `threads` threads; return {key: fn(abort)}. The first error stops the others
    (each fn checks `abort`) and is raised once all have stopped."""
    jobs = list(jobs)
    results, errors = {}, []
    abort = threading.Event()
    lock = threading.Lock()
    queue = list(reversed(jobs))

    def worker():
        while not abort.is_set():
            with lock:
                if not queue:
                    return
                key, fn = queue.pop()
            try:
                value = fn(abort)
            except BaseException as exc:  # noqa: B902 - re-raised in the caller's thread
                with lock:
                    errors.append(exc)
                abort.set()
                return
            with lock:
                results[key] = value

    workers = [threading.Thread(target=worker, daemon=True) for _n in range(max(1, min(threads, len(jobs))))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    real = [e for e in errors if not isinstance(e, InterruptedError)]
    if real or errors:
        raise (real or errors)[0]
    return results
