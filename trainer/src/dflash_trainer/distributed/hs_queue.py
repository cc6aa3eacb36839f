"""The hidden-state queue of one drafter rank: bounded, filled by the receiving thread, emptied by the loop.

Bounds: at most `depth` batches are held or being received at once (a slot is reserved before a transfer
starts, so a slow drafter makes the target ranks wait instead of growing memory); the loop's first optimizer
step waits until `min_ready` batches are in (or no more will come). On CUDA the tensors live in pinned host
memory (page-locked, so the copy to the drafter's GPU is asynchronous).

A failed receiver closes the queue with its error; the loop's next get() raises it, so a dead target rank
stops the drafter instead of leaving it waiting.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time


def batch_tap_bytes(token_budget: int, num_taps: int, hidden: int, soft_labels: bool, on_cuda: bool) -> int:
    """Host bytes of one queued micro-batch: its padded tokens (at most --token-budget) x the K taps (+ the last
    hidden state for soft labels) x hidden x 2 bytes (bf16; 4 on the CPU, where the target runs in fp32)."""
    return token_budget * (num_taps + int(soft_labels)) * hidden * (2 if on_cuda else 4)


def meminfo(field: str) -> int:
    """A field of /proc/meminfo (MemAvailable, MemTotal), in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/meminfo")


def mem_available() -> int:
    return meminfo("MemAvailable")


def check_host_memory(depth: int, batch_bytes: int, drafters_here: int, available: int, detail: str) -> None:
    """Refuses (StartupError, one line with the numbers) when the queues of this host's drafter ranks, full,
    would not fit its available memory: depth x batch bytes x drafter ranks on this host."""
    from dflash_trainer.config import StartupError
    need = depth * batch_bytes * drafters_here
    if need <= available:
        return
    fits = available // (batch_bytes * drafters_here)
    raise StartupError(
        f"the hidden-state queues need {need / 1e9:.1f} GB of pinned host memory: --hs-queue-depth {depth} x "
        f"{batch_bytes / 1e9:.2f} GB per micro-batch ({detail}) x {drafters_here} drafter rank(s) on this host, "
        f"but {available / 1e9:.1f} GB is available; lower --hs-queue-depth to {fits} or less (and "
        f"--hs-queue-min-ready with it) or --token-budget, or free memory")


class QueueClosed(RuntimeError):
    """No more items will come (the receiver finished or failed)."""


class HiddenStateQueue:
    def __init__(self, depth: int, min_ready: int):
        if depth < 1 or not 0 <= min_ready <= depth:
            raise ValueError(f"hidden-state queue depth {depth}, min-ready {min_ready}: need depth >= 1 and "
                             "0 <= min-ready <= depth; fix --hs-queue-depth/--hs-queue-min-ready")
        self.depth = depth
        self.min_ready = min_ready
        self._items: collections.deque = collections.deque()
        self._reserved = 0
        self._closed = False
        self._draining = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self.high_water = 0          # most slots ever in use (held + being received)
        self.num_put = 0
        self.wait_s = 0.0            # time the loop spent waiting in get()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    # --- receiver side ---
    def reserve(self) -> bool:
        """Waits for a free slot; False if the queue now drops everything (the loop stopped)."""
        with self._cond:
            while not self._draining and len(self._items) + self._reserved >= self.depth:
                self._cond.wait()
            if self._draining:
                return False
            self._reserved += 1
            self.high_water = max(self.high_water, len(self._items) + self._reserved)
            return True

    def put(self, item) -> None:
        """Fills a reserved slot."""
        with self._cond:
            self._reserved -= 1
            if not self._draining:
                self._items.append(item)
                self.num_put += 1
            self._cond.notify_all()

    def release(self) -> None:
        """Gives a reserved slot back unfilled."""
        with self._cond:
            self._reserved -= 1
            self._cond.notify_all()

    def close(self, error: BaseException | None = None) -> None:
        with self._cond:
            self._closed = True
            self._error = self._error or error
            self._cond.notify_all()

    # --- loop side ---
    def wait_ready(self, count: int, stop: threading.Event | None = None, poll_s: float = 0.5) -> None:
        """Until `count` items are in, the receiver is done, or `stop` is set."""
        with self._cond:
            while len(self._items) < count and not self._closed and not (stop is not None and stop.is_set()):
                self._cond.wait(poll_s)
            if self._error is not None:
                raise QueueClosed(f"hidden-state receiver failed: {self._error}") from self._error

    def get(self):
        t0 = time.perf_counter()
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            self.wait_s += time.perf_counter() - t0
            if self._items:
                item = self._items.popleft()
                self._cond.notify_all()
                return item
            if self._error is not None:
                raise QueueClosed(f"hidden-state receiver failed: {self._error}") from self._error
            raise QueueClosed("hidden-state queue is empty and the receiver has finished")

    def peek(self, count: int) -> list:
        """The first `count` items (fewer if no more come), left in the queue: the compile warm-up runs on them
        and the loop trains on them after, so the queue never holds more than its depth."""
        self.wait_ready(count)
        with self._cond:
            return list(itertools.islice(self._items, count))

    def drain(self) -> None:
        """The loop stopped early: drop what is held and discard what still arrives (targets must not block)."""
        with self._cond:
            self._draining = True
            self._items.clear()
            self._cond.notify_all()
