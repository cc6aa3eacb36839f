"""heartbeat.json: the run contract's liveness file (docs/design.md, "The run contract").

Stdlib only, because the first heartbeat is written before torch is imported.
Content: {pid, phase, step, epoch, tokens_per_s, loss, updated_at, error?, stopped?}; always replaced
atomically (temp file in the same directory + os.replace) so a reader never sees half a file.
A full disk must not leave the heartbeat at its last phase: the run dir keeps .heartbeat.reserve (RESERVE_BYTES,
allocated at start), and a phase change that finds no space releases it and writes again, so `failed` and its
error still reach the file (and the log line after it has room too); the periodic writes leave it alone.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time

PHASES = ("loading", "training", "checkpointing", "finished", "failed")
RESERVE_NAME = ".heartbeat.reserve"
RESERVE_BYTES = 1 << 20  # many heartbeats and the error lines of the log


def write_json_atomic(path: str, payload, indent: int | None = None) -> None:
    """Write then rename: os.replace is atomic within one filesystem, so readers see old or new."""
    write_text_atomic(path, json.dumps(payload, indent=indent) + "\n")


def write_text_atomic(path: str, text: str) -> None:
    """write_json_atomic's write then rename, for any text (UTF-8)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str, data: bytes) -> None:
    """The write then rename of the two above, for any bytes."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:  # no temp file left behind (a full disk leaves a 0-byte one otherwise)
            os.unlink(tmp)
        except OSError:
            pass
        raise


def reserve_space(path: str, size: int) -> None:
    """Allocates `size` bytes to `path` (blocks really taken, not a sparse file); best effort."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    except OSError:
        pass


class Heartbeat:
    """Holds the trainer's current status and rewrites heartbeat.json periodically and on phase change."""

    def __init__(self, run_dir: str, interval_s: float = 2.0):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "heartbeat.json")
        self.reserve_path = os.path.join(run_dir, RESERVE_NAME)
        reserve_space(self.reserve_path, RESERVE_BYTES)
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._state = {"pid": os.getpid(), "phase": "loading", "step": 0, "epoch": 0,
                       "tokens_per_s": None, "loss": None}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self, use_reserve: bool = True) -> None:
        """use_reserve=False (the periodic writes): a full disk raises instead of taking the reserve, which stays for
        the phase changes (`failed` and its error); taken by a periodic write in the middle of a checkpoint, it also
        made the checkpoint's error report the reserve's 1 MiB as free space."""
        with self._lock:
            payload = dict(self._state, updated_at=time.time())
            # Several threads may write; the lock also serializes the shared temp file name.
            try:
                write_json_atomic(self.path, payload)
            except OSError as e:
                if e.errno != errno.ENOSPC or not use_reserve or not self.release_reserve():
                    raise
                write_json_atomic(self.path, payload)

    def release_reserve(self) -> bool:
        """Frees the reserved space for the last writes of a failing run; False if it was already gone."""
        try:
            os.unlink(self.reserve_path)
            return True
        except OSError:
            return False

    def update(self, **fields) -> None:
        """Record new numbers; they reach the file at the next periodic write."""
        with self._lock:
            self._state.update(fields)

    def set_phase(self, phase: str, **fields) -> None:
        """Phase changes are written immediately: the launcher waits on them."""
        assert phase in PHASES, phase
        self.update(phase=phase, **fields)
        self.write()

    @property
    def phase(self) -> str:
        return self._state["phase"]

    def start(self) -> None:
        """Periodic writes from a daemon thread, so long phases (loading a 27B target, a slow checkpoint)
        still look alive; a hung training loop shows up as `step` not advancing, not as a stale file."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.write(use_reserve=False)
            except OSError:  # a full disk must not kill training; the next write retries
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
