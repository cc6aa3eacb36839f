"""How the training loop reduces gradients and agrees on per-step host values: not at all (one process), or
over the drafter ranks of a torchrun job (DDP or FSDP2: drafter_parallel.ParallelDrafter). Each also says when
the training clock is read: one process reads it before each optimizer step; under torchrun the first drafter
rank reads it at the end of each step and its reading travels with the step's one all-reduce of host values
(loss, micro-batches, tokens, the stop flag, sequences, slot counts), so every drafter rank holds the same
training time and stops, snapshots and schedules at the same step."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dflash_trainer.distributed.drafter_parallel import pad_micro_batches


@dataclass
class Agreed:
    """A step's host values as every rank holds them after the agreement."""

    loss: float           # mean micro-batch loss of the step
    tokens: int           # tokens trained on in the step, all ranks
    sequences: int
    correct: torch.Tensor  # [S] per-slot correct predictions, all ranks
    count: torch.Tensor    # [S] per-slot supervised positions
    stop: bool            # a rank saw SIGTERM (or a target asked to stop)
    train_s: float        # the training clock after the agreement


class OneProcess:
    """The drafter itself trains; nothing to reduce or agree on; `stop` (SIGTERM) read locally."""

    sharded = False

    def __init__(self, drafter, stop, clock):
        self.model, self.drafter, self.stop, self.clock = drafter, drafter, stop, clock
        self.t_clock = None

    def mine(self, slots):
        return slots

    def padding(self, num_mine: int, num_slots: int) -> tuple[bool, int]:
        """(sum gradients by hand, zero-weighted extra micro-batches)."""
        return False, 0

    def accumulating(self, accumulate: bool):
        return contextlib.nullcontext()

    def finish_gradients(self, params, by_hand: bool) -> None:
        pass

    def clip_grad_norm(self, params, max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def agree_to_stop(self) -> bool:
        return self.stop.is_set()

    def start_clock(self) -> None:
        self.t_clock = self.clock()

    def before_step(self, train_s0: float, train_s: float) -> float:
        """The training clock now; after the loop: the minutes the last step ran through (not read when the
        budget's end stopped the loop)."""
        return train_s0 + self.clock() - self.t_clock

    after_loop = before_step

    def agree(self, loss_sum: float, num_micro: int, tokens: int, sequences: int, correct, count,
              train_s0: float, train_s: float) -> Agreed:
        return Agreed(loss_sum / num_micro, tokens, sequences, correct, count, self.stop.is_set(), train_s)

    def full_state(self, optimizer) -> tuple[dict, dict]:
        return self.drafter.trainable_state_dict(), optimizer.state_dict()

    def barrier(self) -> None:
        pass


class DrafterRanks:
    """A torchrun drafter rank: `parallel` (ParallelDrafter) averages the gradients over the drafter group; a
    short last step (some rank without a micro-batch) sums them by hand under DDP, or pads with zero-weighted
    repeats under FSDP (pad_micro_batches); host values go through one all-reduce per step."""

    def __init__(self, parallel, world, stop, clock, stop_requested_key: str):
        self.parallel, self.world, self.stop, self.clock = parallel, world, stop, clock
        self.model, self.drafter, self.sharded = parallel.model, parallel.drafter, parallel.sharded
        self.group, self.D, self.d = world.drafter_group, world.num_drafter_ranks, world.role_rank
        self.leader, self.stop_requested_key, self.t_clock = world.is_drafter_leader, stop_requested_key, None

    def mine(self, slots):
        return [s for s in slots if s.micro % self.D == self.d]

    def padding(self, num_mine: int, num_slots: int) -> tuple[bool, int]:
        """DDP all-reduces during the last backward; when some drafter has no micro-batch in this (last, short)
        step, every drafter sums gradients by hand instead, so nobody waits for a backward that never comes.
        FSDP shards instead: every drafter runs as many forwards (gathers) as the first, padding with
        zero-weighted repeats of its last micro-batch, and the last backward's reduce-scatter averages."""
        return num_slots < self.D and not self.sharded, pad_micro_batches(num_mine, num_slots, self.D, self.sharded)

    def accumulating(self, accumulate: bool):
        return self.parallel.no_sync() if accumulate else contextlib.nullcontext()

    def finish_gradients(self, params, by_hand: bool) -> None:
        if not by_hand:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=self.group)
            p.grad /= self.D

    def clip_grad_norm(self, params, max_norm: float) -> float:
        return self.parallel.clip_grad_norm(params, max_norm)

    def _stop_seen(self) -> bool:
        return self.stop.is_set() or self.world.store.check([self.stop_requested_key])

    def agree_to_stop(self) -> bool:
        flag = torch.tensor([float(self._stop_seen())])
        dist.all_reduce(flag, group=self.group)
        return flag.item() > 0

    def start_clock(self) -> None:
        self.t_clock = self.clock()  # the first drafter rank's clock is the job's (the others' are not used)

    def before_step(self, train_s0: float, train_s: float) -> float:
        """Unchanged: the clock was read at the end of the last step, with its agreement."""
        return train_s

    after_loop = before_step

    def agree(self, loss_sum: float, num_micro: int, tokens: int, sequences: int, correct, count,
              train_s0: float, train_s: float) -> Agreed:
        # a CPU tensor: gloo carries it, also in a cpu:gloo,cuda:nccl group
        local_stop = self._stop_seen()
        stats = torch.tensor([loss_sum, num_micro, tokens, float(local_stop),
                              self.clock() - self.t_clock if self.leader else 0.0, sequences]
                             + correct.tolist() + count.tolist(), dtype=torch.float64)
        dist.all_reduce(stats, group=self.group)
        S = correct.numel()
        return Agreed(stats[0].item() / stats[1].item(), int(stats[2]), int(stats[5]), stats[6:6 + S],
                      stats[6 + S:], stats[3].item() > 0, train_s0 + stats[4].item())

    def full_state(self, optimizer) -> tuple[dict, dict]:
        return self.parallel.full_state(optimizer)  # FSDP gathers on every drafter rank

    def barrier(self) -> None:
        dist.barrier(group=self.group)
