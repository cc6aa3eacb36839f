"""What the training loop writes, once for one process and for torchrun's drafter ranks: the metrics window and
its rows (metrics.jsonl, W&B), checkpoints (the TrainState in checkpoint.py's format) and snapshots
(snapshots.jsonl, wall_clock.keep_snapshot). Under torchrun only the first drafter rank (`writer`) writes files;
every drafter rank takes part in a checkpoint (FSDP gathers the full state collectively) and its barrier."""

from __future__ import annotations

import os
import time
import zlib
from contextlib import ExitStack

from dflash_trainer.loop.checkpoint import find_latest, save_checkpoint
from dflash_trainer.loss import acceptance_proxy
from dflash_trainer.telemetry.writers import JsonlWriter
from dflash_trainer.loop.wall_clock import keep_snapshot, pending_snapshots


class Window:
    """The steps since the last metrics row: loss, tokens, seconds, per-slot counts, the data order's crc."""

    def __init__(self):
        self.loss, self.tokens, self.time, self.steps = 0.0, 0, 0.0, 0
        self.correct = self.count = None
        self.crc = 0

    def add_rows(self, slots) -> None:
        for slot in slots:
            self.crc = zlib.crc32(str(slot.indices).encode(), self.crc)

    def add_step(self, loss: float, tokens: int, seconds: float, correct, count) -> None:
        self.loss += loss
        self.tokens += tokens
        self.time += seconds
        self.steps += 1
        self.correct = correct if self.correct is None else self.correct + correct
        self.count = count if self.count is None else self.count + count


class Bookkeeping:
    """`state` (TrainState) is the loop's; `reducer` gives the full weights and optimizer state and the barrier;
    `source` adds its metrics fields (the queue's); `saved` is (step, path) of the checkpoint resumed from ((-1,
    None): a fresh run; the path None where it is not known: snapshots then link find_latest's); `extra_state`
    goes into train_state.pt besides the TrainState (torchrun: the world layout)."""

    def __init__(self, stack: ExitStack, cfg, *, writer: bool, state, reducer, optimizer, drafter_cfg, source,
                 dataset_rows: int, say, on_phase, profile, wandb_run, saved: tuple, extra_state: dict):
        self.cfg, self.writer, self.state, self.reducer, self.optimizer = cfg, writer, state, reducer, optimizer
        self.drafter_cfg, self.source, self.dataset_rows, self.say = drafter_cfg, source, dataset_rows, say
        self.on_phase, self.profile, self.wandb_run, self.extra_state = on_phase, profile, wandb_run, extra_state
        self.saved_step, self.saved_path = saved
        self.window, self.last_row, self.pending = Window(), {}, pending_snapshots(cfg)
        self.metrics = self.snapshots = None
        self.eta = None  # loop.eta.Eta, the loop's (drafter_loop.LoopParts sets it)
        if writer:
            self.metrics = JsonlWriter(os.path.join(cfg.run_dir, "metrics.jsonl"))
            stack.callback(self.metrics.close)
            self.snapshots = JsonlWriter(os.path.join(cfg.run_dir, "snapshots.jsonl"))
            stack.callback(self.snapshots.close)

    def checkpoint(self) -> None:
        self.on_phase("checkpointing")
        t0 = time.perf_counter()
        weights, optimizer_state = self.reducer.full_state(self.optimizer)
        if self.writer:  # a full disk raises CheckpointWriteError here: the job ends with its one line
            saved = self.state.to_checkpoint(optimizer_state, self.cfg.to_dict(), **self.extra_state)
            self.saved_path = save_checkpoint(self.cfg.output_dir, self.state.step, weights,
                                              self.drafter_cfg.to_dict(), saved, self.cfg.keep_checkpoints,
                                              say=self.say)
            self.profile.add("checkpoint", time.perf_counter() - t0)
            self.say(f"checkpoint {self.saved_path} ({time.perf_counter() - t0:.2f} s)")
        self.saved_step = self.state.step
        self.reducer.barrier()  # no drafter leaves before the checkpoint is complete
        self.on_phase("training")

    def checkpoint_unless_saved(self) -> None:
        if self.saved_step != self.state.step and self.state.data is not None:
            self.checkpoint()

    def write_metrics(self, lr: float, amp: float, grad_norm: float) -> None:
        """The window's row (first drafter rank only under torchrun); the window starts again."""
        w, st = self.window, self.state
        if self.writer and w.steps:
            acc = (w.correct / w.count.clamp(min=1)).tolist()
            row = {"step": st.step, "epoch": st.data["epoch"], "loss": w.loss / w.steps,
                   "slot_acc": [round(a, 4) for a in acc], "tau_proxy": acceptance_proxy(acc),
                   "tokens_per_s": w.tokens / w.time, "lr": lr, "noise": amp, "grad_norm": grad_norm,
                   "num_bad_steps": st.num_bad_steps, "data_crc": w.crc, "train_s": round(st.train_s, 3),
                   "sequences": st.num_sequences, **self.source.metrics_fields(), **self._eta_fields(),
                   "time": time.time()}
            self.metrics.write(row)
            if self.wandb_run is not None:
                self.wandb_run.metrics(row)
            self.last_row.update(row)
            self.say(f"step {st.step}{self.eta.log_words() if self.eta else ''} epoch {st.data['epoch']} loss {row['loss']:.4f} acc1 {acc[1]:.3f} "
                     f"tau {row['tau_proxy']:.3f} tokens/s {row['tokens_per_s']:.1f} lr {lr:.3e} noise {amp:.4f} "
                     f"train {st.train_s:.1f} s" + self.source.log_suffix())
        self.window = Window()

    def _eta_fields(self) -> dict:
        """total_steps, done_pct, eta_s, ends_by of the last step (none before the loop's first)."""
        return dict(self.eta.fields) if self.eta else {}

    def take_due_snapshots(self, last_step) -> None:
        """The snapshots whose minutes the training clock has reached: the weights after the last step (on every
        drafter rank at the same step: train_s is agreed). `last_step` is (lr, noise, grad norm) for the row."""
        while self.pending and self.state.train_s >= self.pending[0] * 60:
            self._snapshot(self.pending.pop(0), last_step)

    def _snapshot(self, minutes: float, last_step) -> None:
        st = self.state
        if self.window.steps:
            self.write_metrics(*last_step)
        if self.saved_step != st.step:
            self.checkpoint()
        if self.writer:
            dst = keep_snapshot(self.cfg, self.snapshots, minutes, self.saved_path or find_latest(self.cfg.output_dir),
                                step=st.step, train_s=st.train_s, epoch=st.data["epoch"],
                                sequences=st.num_sequences, dataset_rows=self.dataset_rows, metrics=self.last_row)
            self.say(f"snapshot at {minutes:g} min of training: step {st.step}, {st.num_sequences} sequences, {dst}")
