"""The batch plan: which dataset rows each optimizer step trains on, as one process draws them from the
BatchLoader. Under torchrun every rank walks the same plan (target ranks to compute, drafter ranks to receive
and train), so G = --grad-accum x D micro-batches per step land where one process would put them."""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trainer.data.batches import BatchLoader


@dataclass
class Slot:
    step: int
    micro: int          # g, over all drafter ranks
    k: int              # stream index since this job started
    indices: list[int]  # dataset rows


class StepPlan:
    """(step, slots, data position after the step) in the single-process loop's batch order, from `data_state`
    (a checkpoint's data position; None: the start) and step `step0`."""

    def __init__(self, dataset, cfg, data_state: dict | None, step0: int, total_steps: int, micro_per_step: int):
        self.loader = BatchLoader(dataset, cfg.seed, cfg.token_budget, cfg.max_batch_size)
        if data_state is not None:
            self.loader.load_state_dict(data_state)
        self.epochs, self.step0, self.total_steps, self.G = cfg.epochs, step0, total_steps, micro_per_step
        self._k = 0

    def take(self, step: int) -> list[Slot]:
        """The next G micro-batches of the plan for optimizer step `step` (fewer where the last epoch ends
        mid-step; [] when it has ended)."""
        loader, slots = self.loader, []
        if step >= self.total_steps or loader.epoch >= self.epochs:
            return slots
        for g in range(self.G):
            if loader.batch_index >= loader.batches_in_epoch() and loader.epoch + 1 >= self.epochs:
                break  # the last epoch ends mid-step: the step trains on what it got
            slots.append(Slot(step, g, self._k, loader._next_indices()))
            self._k += 1
        return slots

    def steps(self):
        step = self.step0
        while True:
            slots = self.take(step)
            if not slots:
                return
            yield step, slots, self.loader.state_dict()
            step += 1
