# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Copy files while hashing them (one read of the source), several at a time. Runs INSIDE the container.

Reads and writes release the GIL, and so do hashlib and xxhash on large buffers, so threads copy shards in
parallel. A source file that changes while it is copied (size or mtime) fails the copy: a half-old, half-new
shard must never be staged.

The source is read through a read-only memory map: each chunk is hashed and written straight from the page cache,
which spares the copy into a buffer (benchmarks/stage.py: about 15% less CPU than readinto + write on tmpfs). A
file that cannot be mapped (empty, or on a filesystem without mmap) is read into a buffer instead. A source
truncated in place while it is mapped: each chunk is written before it is hashed, and the write of a chunk past the
new end fails with EFAULT, which is SourceChanged; should the truncation land between a chunk's write and its hash,
the hash's read past the end kills the stager with SIGBUS. Either way the staging fails before anything is
replaced, and weights_backend names the cause of a SIGBUS.
"""

import errno
import mmap
import os
import threading

from .weights_manifest import BUF_BYTES, new_hasher

COPY_MODE = 0o444  # staged weights are immutable; versions share them through hard links


class SourceChanged(Exception):
    pass


def copy_hashing(src, dst, algorithm, expect, abort, progress=None):
    """Copy src to the new file dst; return its content hash. expect = {size, mtime_ns} seen by the plan;
    progress (weights_progress.CopyProgress) counts the bytes as they are written."""
    h = new_hasher(algorithm)
    with open(src, "rb", buffering=0) as fin:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            mapping = _map(fin)
            if mapping is None:
                done = _copy_read(fin, fd, h, abort, progress)
            else:
                try:
                    done = _copy_mapped(mapping, fd, h, abort, progress)
                except OSError as exc:
                    if exc.errno != errno.EFAULT:
                        raise
                    raise SourceChanged("source file %s shrank while it was copied; re-run when the model store "
                                        "is no longer being written" % src)
                finally:
                    mapping.close()
            st = os.fstat(fin.fileno())
        finally:
            os.close(fd)
    if done != expect["size"] or st.st_size != expect["size"] or st.st_mtime_ns != expect["mtime_ns"]:
        raise SourceChanged("source file %s changed while it was copied (%d bytes read, %d expected); re-run when "
                            "the model store is no longer being written" % (src, done, expect["size"]))
    os.chmod(dst, COPY_MODE)
    return h.hexdigest()


def _map(fin):
    """A read-only mapping of the whole file, or None where it cannot be mapped (empty, no mmap support)."""
    size = os.fstat(fin.fileno()).st_size
    if not size:
        return None
    try:
        return mmap.mmap(fin.fileno(), size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None


def _write_all(fd, chunk):
    written = 0
    while written < len(chunk):
        written += os.write(fd, chunk[written:])


def _copy_mapped(mapping, fd, h, abort, progress=None):
    """Hash and write the mapping chunk by chunk; return the bytes copied (the file's size when it was mapped)."""
    view = memoryview(mapping)
    try:
        for offset in range(0, len(mapping), BUF_BYTES):
            if abort.is_set():
                raise InterruptedError("aborted")
            with view[offset:offset + BUF_BYTES] as chunk:  # released even on an error: the mapping can close
                _write_all(fd, chunk)  # first: past a truncated source's end it fails with EFAULT, not SIGBUS
                h.update(chunk)
                if progress is not None:
                    progress.add(len(chunk))
        return len(mapping)
    finally:
        view.release()


def _copy_read(fin, fd, h, abort, progress=None):
    """Read into a buffer, hash and write it, until EOF; return the bytes copied."""
    buf = bytearray(BUF_BYTES)
    view = memoryview(buf)
    done = 0
    while True:
        if abort.is_set():
            raise InterruptedError("aborted")
        n = fin.readinto(buf)
        if not n:
            return done
        chunk = view[:n]
        h.update(chunk)
        _write_all(fd, chunk)
        done += n
        if progress is not None:
            progress.add(n)


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
