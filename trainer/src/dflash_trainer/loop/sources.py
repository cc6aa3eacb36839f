"""Where the training loop's micro-batches come from: the local target's forward over the plan's batches (one
process), or the hidden-state queue that target ranks fill (a torchrun drafter rank). Both hand out, for a plan
Slot, an object with taps, last, input_ids, loss_mask and lengths, and run the compile warm-up on their first
micro-batches before the training clock starts (wall_clock.compile_warmup)."""

from __future__ import annotations

import time
from typing import NamedTuple

from dflash_trainer.data.batches import collate
from dflash_trainer.loop.wall_clock import compile_warmup


class MicroBatch(NamedTuple):
    taps: list
    last: object
    input_ids: object
    loss_mask: object
    lengths: object


class LocalTarget:
    """One process: each slot's rows collated and run through the frozen target here. A non-finite step is
    redrawn: the loop takes the plan's next batches for the same step number (`redraws_bad_steps`)."""

    redraws_bad_steps = True

    def __init__(self, target, plan, profile):
        self.target, self.plan, self.profile = target, plan, profile

    def get(self, slot) -> MicroBatch:
        t0 = time.perf_counter()
        batch = collate(self.plan.loader.dataset, slot.indices)
        t1 = time.perf_counter()
        taps, last = self.target(batch.input_ids)
        self.profile.add("data", t1 - t0)
        self.profile.add("target", time.perf_counter() - t1)
        return MicroBatch(taps, last, batch.input_ids, batch.loss_mask, batch.lengths)

    def warmup(self, cfg, drafter, optimizer, say) -> None:
        """The plan's shape-spanning batches; the data position is restored (nothing trained, nothing skipped)."""
        if not cfg.compile_warmup_batches:
            return
        t0, loader = time.perf_counter(), self.plan.loader
        position = loader.state_dict()

        def batches():
            for indices in loader.shape_spanning_batches(cfg.compile_warmup_batches):
                b = collate(loader.dataset, indices)
                taps, last = self.target(b.input_ids)
                yield taps, last, b.input_ids, b.loss_mask, b.lengths

        compile_warmup(cfg, drafter, optimizer, batches())
        loader.load_state_dict(position)
        say(f"compile warm-up: {cfg.compile_warmup_batches} micro-batches, not trained on, "
            f"{time.perf_counter() - t0:.1f} s (outside the training time)")

    def metrics_fields(self) -> dict:
        return {}

    def log_suffix(self) -> str:
        return ""

    def depth(self) -> int:
        return 0

    def end(self, stopping: bool, step: int) -> None:
        pass


class HiddenStates:
    """A torchrun drafter rank: the items target ranks computed for this rank's slots, in plan order, from the
    bounded queue (or received one at a time with --hs-sync-transfers). The targets have moved on: a non-finite
    step still uses up its step number (`redraws_bad_steps` False)."""

    redraws_bad_steps = False

    def __init__(self, cfg, world, hs_queue, receiver, profile, stop_at_key: str):
        self.cfg, self.world, self.queue, self.receiver, self.profile = cfg, world, hs_queue, receiver, profile
        self.stop_at_key, self.held = stop_at_key, []

    def get(self, slot):
        t0 = time.perf_counter()
        if self.held:
            item = self.held.pop(0)
        else:
            item = (self.receiver.next_item if self.cfg.hs_sync_transfers else self.queue.get)()
        self.profile.add("queue_wait", time.perf_counter() - t0)
        assert (item.k, item.micro) == (slot.k, slot.micro), (item.k, slot.k)
        return item

    def warmup(self, cfg, drafter, optimizer, say, num_warm: int) -> None:
        """Forward and backward on my first `num_warm` micro-batches, which stay mine to train on (left in the
        queue; with --hs-sync-transfers held here); no collective, no DDP hook."""
        if not num_warm:
            return
        t0 = time.perf_counter()
        if cfg.hs_sync_transfers:
            self.held = [self.receiver.next_item() for _ in range(num_warm)]
            warm = self.held
        else:
            warm = self.queue.peek(num_warm)
        count = compile_warmup(cfg, drafter, optimizer, ((i.taps, i.last, i.input_ids, i.loss_mask, i.lengths)
                                                          for i in warm))
        say(f"compile warm-up: {count} micro-batches, not trained on, {time.perf_counter() - t0:.1f} s "
            "(outside the training time)")

    def metrics_fields(self) -> dict:
        return {"queue_high_water": self.queue.high_water, "queue_wait_s": round(self.queue.wait_s, 4)}

    def log_suffix(self) -> str:
        return f" queue {len(self.queue)}/{self.queue.depth}"

    def depth(self) -> int:
        return len(self.queue)

    def end(self, stopping: bool, step: int) -> None:
        """Stopped early: the targets send nothing for later steps (the first drafter says so), what is queued
        or still arrives is dropped."""
        if stopping and self.world.is_drafter_leader:
            self.world.store.set(self.stop_at_key, str(step - 1))
        if stopping:
            self.queue.drain()
