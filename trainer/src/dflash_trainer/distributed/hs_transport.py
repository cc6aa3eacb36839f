"""Tapped hidden states from a target rank to a drafter rank: what travels, and the two threads that move it.

One item = one micro-batch: a header (8 int64: kind, stream index k, step, micro index g, B, T, has_last, dtype),
then meta [B, 2T+1] int64 (input ids | loss mask | length), then the K taps [B, T, H] and, for soft labels, the
target's final-normed last hidden state [B, T, H] (the drafter applies the frozen lm_head itself: logits, ~500 KB
a token at a 248k vocabulary, never travel). An END header (kind 0) instead of an item tells the drafter that this
target sends it nothing more (the job is stopping).

Paths: NCCL point-to-point between GPUs (taps stay bf16 on the device; the receiving thread copies them to pinned
host memory on its own stream and synchronizes that stream before the queue sees them, so no tensor is read by one
stream while another may free it); host-staged over gloo on the CPU and where two ranks share a GPU (NCCL refuses
that). Headers and meta always go over gloo. Both ends walk the same deterministic plan (loop/plan.StepPlan),
so every recv names its source and the messages of one (target, drafter) pair arrive in the order they were sent.
--hs-sync-transfers turns the overlap off (to check that overlapping changes no result): each transfer then runs
in the training loop itself, on its stream, between two forwards or two steps.

Legend: B sequences, T padded length, H hidden, K taps.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

HEADER_LEN = 8
KIND_END, KIND_ITEM = 0, 1
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@dataclass
class Item:
    k: int                        # stream index since this job started (which target made it: k % T)
    step: int
    micro: int                    # g: index of the micro-batch within its optimizer step, over all drafters
    input_ids: torch.Tensor       # [B, T] int64
    loss_mask: torch.Tensor       # [B, T] bool
    lengths: torch.Tensor         # [B] int64
    taps: list[torch.Tensor]      # K x [B, T, H]
    last: torch.Tensor | None     # [B, T, H] or None

    @property
    def num_bytes(self) -> int:
        tensors = self.taps + ([self.last] if self.last is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


def _header(kind: int, k: int = 0, step: int = 0, micro: int = 0, B: int = 0, T: int = 0, has_last: int = 0,
            dtype: int = 0) -> torch.Tensor:
    return torch.tensor([kind, k, step, micro, B, T, has_last, dtype], dtype=torch.int64)


class Sender:
    """Target side: a thread that sends items in the order given, at most `depth` waiting, so the target's next
    forward overlaps the transfer of the last one's taps."""

    def __init__(self, group, backend: str, device: torch.device, depth: int = 2, synchronous: bool = False,
                 on_sent=None, job_error=None):
        self.group, self.backend, self.device = group, backend, device
        self.synchronous = synchronous  # --hs-sync-transfers: send in the caller, one item at a time, no thread
        self.on_sent = on_sent          # called with each item once its transfer is complete
        # () -> the job's first error or None, asked while the loop waits on the thread: a send blocked on a rank
        # that failed may never return (a drafter that posts no more receives), and the rank must still end
        self.job_error = job_error
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self.bytes_sent = 0
        self._thread = None
        if not synchronous:
            self._thread = threading.Thread(target=self._loop, name="hs-sender", daemon=True)
            self._thread.start()

    def send(self, dst: int, item: Item) -> None:
        self._check()
        event = None
        if self.backend == "nccl":
            if not self.synchronous:
                event = torch.cuda.Event()
                event.record()  # the taps are complete once the current (compute) stream reaches this point
        else:
            # host-staged: one copy to the host here; on the CPU the taps already are host tensors
            item.taps = [t.to("cpu") for t in item.taps]
            item.last = item.last.to("cpu") if item.last is not None else None
        if self.synchronous:  # on the compute stream, complete before the next forward starts
            self._send_item(dst, item)
            if self.backend == "nccl":
                torch.cuda.current_stream(self.device).synchronize()
            self._sent(item)
            return
        self._put((dst, item, event))

    def send_end(self, dst: int) -> None:
        self._check()
        if self.synchronous:
            dist.send(_header(KIND_END), dst, group=self.group)
            return
        self._put((dst, None, None))

    def close(self) -> None:
        """Waits until everything queued is sent."""
        if self._thread is not None:
            self._put(None)
            while self._thread.is_alive():
                self._thread.join(timeout=0.5)
                self._check_waiting()
        self._check()

    def _sent(self, item: Item) -> None:
        self.bytes_sent += item.num_bytes
        if self.on_sent is not None:
            self.on_sent(item)

    def _put(self, entry) -> None:
        while True:
            try:
                self._q.put(entry, timeout=0.5)
                return
            except queue.Full:
                self._check_waiting()

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"sending hidden states failed: {self._error}") from self._error

    def _check_waiting(self) -> None:
        """Every half second of a wait (the store is asked only then, not at every send)."""
        self._check()
        error = self.job_error() if self.job_error is not None else None
        if error is not None:
            raise RuntimeError(f"sending hidden states stopped: the job failed ({error})")

    def _loop(self) -> None:
        try:
            stream = torch.cuda.Stream(self.device) if self.backend == "nccl" else None
            while True:
                entry = self._q.get()
                if entry is None:
                    return
                dst, item, event = entry
                if item is None:
                    dist.send(_header(KIND_END), dst, group=self.group)
                    continue
                if stream is not None:
                    with torch.cuda.stream(stream):
                        stream.wait_event(event)
                        self._send_item(dst, item)
                        stream.synchronize()  # bounds GPU memory: this item's taps are free after this
                else:
                    self._send_item(dst, item)
                self._sent(item)
        except BaseException as e:  # noqa: BLE001 - reported to the loop by _check
            self._error = e
            while True:  # unblock a loop waiting on a full queue
                try:
                    self._q.get_nowait()
                except queue.Empty:
                    break

    def _send_item(self, dst: int, item: Item) -> None:
        B, T = item.input_ids.shape
        dtype = DTYPES.index(item.taps[0].dtype)
        dist.send(_header(KIND_ITEM, item.k, item.step, item.micro, B, T, int(item.last is not None), dtype),
                  dst, group=self.group)
        meta = torch.cat([item.input_ids.to("cpu", torch.int64), item.loss_mask.to("cpu", torch.int64),
                          item.lengths.to("cpu", torch.int64)[:, None]], dim=1)
        dist.send(meta, dst, group=self.group)
        for t in item.taps + ([item.last] if item.last is not None else []):
            dist.send(t.contiguous(), dst, group=self.group)


class Receiver:
    """Drafter side: a thread that receives this drafter's items in schedule order into the bounded queue.

    `expected` yields (k, step, micro, src) for every item meant for this drafter rank, in order. With
    `synchronous` (--hs-sync-transfers) there is no thread: the training loop calls next_item() when it needs
    an item, and the transfer runs on the loop's own stream, nothing overlapping it."""

    def __init__(self, expected, hs_queue, group, backend: str, device: torch.device, num_taps: int, hidden: int,
                 synchronous: bool = False):
        self.expected, self.hs_queue, self.group, self.backend = expected, hs_queue, group, backend
        self.device, self.num_taps, self.hidden = device, num_taps, hidden
        self.synchronous = synchronous
        self.ended: set[int] = set()
        self.bytes_received = 0
        self._items = None
        self._thread = threading.Thread(target=self._loop, name="hs-receiver", daemon=True)

    def start(self) -> "Receiver":
        if self.synchronous:
            self._items = self._receive_all(reserve=False)
        else:
            self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        if self.synchronous:  # what the targets still send (items of a stopped run, END markers): received, dropped
            for _ in self._items:
                pass
            return
        self._thread.join(timeout)

    def next_item(self) -> Item:
        """The next item, received now (synchronous mode)."""
        from dflash_trainer.distributed.hs_queue import QueueClosed
        try:
            return next(self._items)
        except StopIteration:
            raise QueueClosed("no more hidden states: every target rank has ended") from None

    def _receive_all(self, reserve: bool):
        stream = torch.cuda.Stream(self.device) if self.backend == "nccl" and not self.synchronous else None
        for k, step, micro, src in self.expected:
            if src in self.ended:
                continue
            keep = self.hs_queue.reserve() if reserve else True  # a full queue holds the target back
            item = self._recv(src, stream)
            if item is None:
                self.ended.add(src)
                if reserve and keep:
                    self.hs_queue.release()
                continue
            if (item.k, item.step, item.micro) != (k, step, micro):
                raise RuntimeError(f"rank {src} sent item k={item.k} step={item.step} micro={item.micro}, "
                                   f"expected k={k} step={step} micro={micro}: the ranks' schedules differ")
            yield item

    def _loop(self) -> None:
        error = None
        try:
            for item in self._receive_all(reserve=True):
                self.hs_queue.put(item)
        except BaseException as e:  # noqa: BLE001 - handed to the training loop through the queue
            error = e
        self.hs_queue.close(error)

    def _recv(self, src: int, stream) -> Item | None:
        header = torch.empty(HEADER_LEN, dtype=torch.int64)
        dist.recv(header, src, group=self.group)
        kind, k, step, micro, B, T, has_last, dtype = header.tolist()
        if kind == KIND_END:
            return None
        meta = torch.empty(B, 2 * T + 1, dtype=torch.int64)
        dist.recv(meta, src, group=self.group)
        shape, dtype = (B, T, self.hidden), DTYPES[dtype]
        num = self.num_taps + int(has_last)
        pin = self.device.type == "cuda"
        if self.backend != "nccl":  # host-staged: straight into (pinned) host memory
            tensors = [torch.empty(shape, dtype=dtype, pin_memory=pin) for _ in range(num)]
            for t in tensors:
                dist.recv(t, src, group=self.group)
        elif stream is None:  # synchronous: on the loop's stream, left on the GPU for the step that follows
            tensors = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(num)]
            for t in tensors:
                dist.recv(t, src, group=self.group)
            torch.cuda.current_stream(self.device).synchronize()
        else:
            with torch.cuda.stream(stream):
                on_gpu = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(num)]
                for t in on_gpu:
                    dist.recv(t, src, group=self.group)
                tensors = [torch.empty(shape, dtype=dtype, pin_memory=True) for _ in range(num)]
                for host, dev in zip(tensors, on_gpu):
                    host.copy_(dev, non_blocking=True)
                stream.synchronize()  # the host copies are complete and on_gpu may be freed
        item = Item(k, step, micro, meta[:, :T], meta[:, T:2 * T].bool(), meta[:, 2 * T].clone(),
                    tensors[:self.num_taps], tensors[self.num_taps] if has_last else None)
        self.bytes_received += item.num_bytes
        return item
