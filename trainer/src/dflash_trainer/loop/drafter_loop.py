"""The training loop, the one that trains a drafter, in one process and on each torchrun drafter rank:
loop { snapshot when due, stop at the time budget, take the step's slots from the plan, forward + backward over
this rank's micro-batches, reduce, agree, update, log when due, checkpoint when due }, then the last row,
snapshots and checkpoint. What differs between one process and a drafter rank is passed in (LoopParts):
where micro-batches come from (loop/sources.py) and how gradients and host values are reduced (loop/reducers.py);
what is written is loop/bookkeeping.py's, the profile loop/progress.py's."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch

from dflash_trainer.loop.eta import Eta
from dflash_trainer.loop.step import derived_seed

# Test hook: seconds slept after each optimizer step (counted as training time). The test suites' live runs, which
# only need to stay alive and step while playbooks run beside them, then leave the cores to those.
STEP_PAUSE_ENV = "DFLASH_DEBUG_STEP_PAUSE_S"


@dataclass
class LoopParts:
    cfg: object
    state: object        # loop.train_state.TrainState, updated in place
    plan: object         # loop.plan.StepPlan
    source: object       # loop.sources.LocalTarget | HiddenStates
    reducer: object      # loop.reducers.OneProcess | DrafterRanks
    books: object        # loop.bookkeeping.Bookkeeping
    profile: object      # loop.progress.LocalProfile | RankProfile
    optimizer: torch.optim.Optimizer
    trainable: list
    schedule: object     # schedule.Schedule: lr, noise, time budget
    total_steps: int
    micro_batch: object  # step.drafter_micro_batch (the callers pass theirs)
    say: object
    block_size: int
    train_s0: float = field(init=False)
    eta: Eta = field(init=False)  # step of total, share done, ETA: the log lines, metrics and heartbeat
    last_micro: object = None  # FSDP repeats it, zero-weighted, where a short last step leaves a rank fewer

    def __post_init__(self):
        self.train_s0 = self.state.train_s  # the training time resumed from: the clock goes on from there
        self.eta = Eta(self.total_steps, self.schedule.budget_s)
        self.books.eta = self.eta


@dataclass
class StepResult:
    agreed: object       # reducers.Agreed
    grad_norm: float
    tokens: int          # this rank's
    items: int           # this rank's micro-batches
    t_step: float
    t_opt: float


@dataclass
class Outcome:
    budget_spent: bool
    stopped: bool


def train(p: LoopParts) -> Outcome:
    """Trains until the plan or --max-steps ends, the time budget is spent, or a stop is agreed (SIGTERM)."""
    cfg, st, books, reducer = p.cfg, p.state, p.books, p.reducer
    stopping, budget_spent, bad_in_row, last = reducer.agree_to_stop(), False, 0, (0.0, 0.0, 0.0)
    pause = float(os.environ.get(STEP_PAUSE_ENV) or 0)
    reducer.start_clock()
    while st.step < p.total_steps and not stopping:
        st.train_s = reducer.before_step(p.train_s0, st.train_s)
        books.take_due_snapshots(last)  # the weights after the last step, at these minutes
        if p.schedule.budget_spent(st.train_s):
            budget_spent = True
            break
        slots = p.plan.take(st.step)
        if not slots:
            break
        st.data = p.plan.loader.state_dict()
        books.window.add_rows(slots)
        lr, amp = p.schedule.lr(st.step, st.train_s), p.schedule.noise(st.step, st.train_s)
        out = run_step(p, slots, lr, amp)
        agreed = out.agreed
        st.train_s = agreed.train_s
        budget_spent = p.schedule.budget_spent(st.train_s)
        stopping = agreed.stop or budget_spent
        finite = math.isfinite(agreed.loss) and math.isfinite(out.grad_norm)
        bad_in_row = 0 if finite else bad_in_row + 1
        if finite:
            p.optimizer.step()
        else:
            st.num_bad_steps += 1
            skipped_update(p, agreed.loss, out.grad_norm, bad_in_row)
        p.optimizer.zero_grad(set_to_none=True)
        if not finite and p.source.redraws_bad_steps:
            continue  # the same step number again, on the plan's next batches
        st.step += 1
        st.num_sequences += agreed.sequences
        p.profile.add("optimizer", time.perf_counter() - out.t_opt)
        elapsed = time.perf_counter() - out.t_step
        p.eta.update(st.step, st.train_s)
        p.profile.after_step(st, agreed, out.tokens, out.items, elapsed, p.source.depth(), p.eta.fields)
        books.window.add_step(agreed.loss, agreed.tokens, elapsed, agreed.correct, agreed.count)
        last = (lr, amp, out.grad_norm)
        if st.step % cfg.log_interval == 0 or st.step == p.total_steps or stopping:
            books.write_metrics(*last)
        p.profile.after_metrics(st, out.tokens)
        books.take_due_snapshots(last)
        if stopping:
            break
        if st.step % cfg.checkpoint_interval == 0:
            books.checkpoint()
        if pause > 0:
            time.sleep(pause)
    if not budget_spent:
        st.train_s = reducer.after_loop(p.train_s0, st.train_s)
    books.write_metrics(*last)
    books.take_due_snapshots(last)
    p.source.end(stopping, st.step)
    books.checkpoint_unless_saved()
    return Outcome(budget_spent, stopping)


def skipped_update(p: LoopParts, loss: float, grad_norm: float, bad_in_row: int) -> None:
    """A non-finite loss or gradient norm: no update; --max-bad-steps of them in a row end the run."""
    st, cfg = p.state, p.cfg
    p.say(f"step {st.step}: non-finite loss {loss} / grad norm {grad_norm}: update skipped "
          f"({bad_in_row} in a row, {st.num_bad_steps} total)")
    if bad_in_row >= cfg.max_bad_steps:
        raise RuntimeError(f"{bad_in_row} non-finite steps in a row at step {st.step}; lower --lr or "
                           f"check the data (--max-bad-steps {cfg.max_bad_steps})")


def run_step(p: LoopParts, slots, lr: float, amp: float) -> StepResult:
    """Forward and backward of this rank's micro-batches of the step (and FSDP's padding), the gradients
    reduced and clipped, the host values agreed; the update is the caller's."""
    cfg, reducer = p.cfg, p.reducer
    t_step = time.perf_counter()
    for group in p.optimizer.param_groups:
        group["lr"] = lr
    mine = reducer.mine(slots)
    by_hand, extra = reducer.padding(len(mine), len(slots))
    loss_sum = correct = count = None
    tokens = sequences = 0
    for i, slot in enumerate(mine):
        micro = p.source.get(slot)
        t_fwd = time.perf_counter()
        with reducer.accumulating(by_hand or i + 1 < len(mine) + extra):
            out = p.micro_batch(reducer.model, micro.taps, micro.last, micro.input_ids, micro.loss_mask,
                                micro.lengths, max_anchors=cfg.max_anchors, gamma=cfg.gamma, noise_amplitude=amp,
                                seed=derived_seed(cfg.seed, slot.step, slot.micro),
                                head_chunk_size=cfg.head_chunk_size,
                                soft_label_temperature=cfg.soft_label_temperature)
            (out.loss / cfg.grad_accum).backward()
        p.profile.add("drafter_fwd_bwd", time.perf_counter() - t_fwd)
        loss_sum = out.loss.detach() if loss_sum is None else loss_sum + out.loss.detach()
        correct = out.slot_correct if correct is None else correct + out.slot_correct
        count = out.slot_count if count is None else count + out.slot_count
        tokens += int(micro.lengths.sum())
        sequences += len(slot.indices)
        p.last_micro = micro
    pad_step(p, extra, slots[0].step)
    # The host waits here for the queued forward/backward work (CUDA runs it asynchronously), so the wait counts
    # as drafter_fwd_bwd; timed after it, "optimizer" was mostly that wait (39% of run 8's time).
    t_wait = time.perf_counter()
    loss_host = 0.0 if loss_sum is None else float(loss_sum)
    p.profile.add("drafter_fwd_bwd", time.perf_counter() - t_wait)
    t_opt = time.perf_counter()
    reducer.finish_gradients(p.trainable, by_hand)
    grad_norm = reducer.clip_grad_norm(p.trainable, cfg.grad_clip)
    if correct is None:  # a drafter rank without a micro-batch in a short last step
        device = p.trainable[0].device
        correct, count = torch.zeros(p.block_size, device=device), torch.zeros(p.block_size, device=device)
    agreed = reducer.agree(loss_host, len(mine), tokens, sequences, correct, count, p.train_s0, p.state.train_s)
    return StepResult(agreed, grad_norm, tokens, len(mine), t_step, t_opt)


def pad_step(p: LoopParts, extra: int, step: int) -> None:
    """FSDP: `extra` zero-weighted repeats of this rank's last micro-batch, so it gathers as often as the others."""
    for i in range(extra):
        m = p.last_micro
        if m is None:
            raise RuntimeError("this drafter rank has no micro-batch to repeat under FSDP; use "
                               "--drafter-sharding ddp or more data")
        with p.reducer.accumulating(i + 1 < extra):
            out = p.micro_batch(p.reducer.model, m.taps, m.last, m.input_ids, m.loss_mask, m.lengths,
                                max_anchors=p.cfg.max_anchors, gamma=p.cfg.gamma, noise_amplitude=0.0,
                                seed=derived_seed(p.cfg.seed, step, -1), head_chunk_size=p.cfg.head_chunk_size,
                                soft_label_temperature=p.cfg.soft_label_temperature)
            (out.loss * 0.0).backward()
