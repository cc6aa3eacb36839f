"""The wall-clock flags' pieces that the training loop (loop/drafter_loop.py, in one process and on torchrun's
drafter ranks) uses: the training clock, the snapshots (--snapshot-minutes and the end of --time-budget-min) and
the compile warm-up (--compile-warmup-batches). The lr and noise by training time are schedule.Schedule's.

When the clock is read and who agrees on it is the loop's reducer's (loop/reducers.py): one process reads it
before each optimizer step; under torchrun the first drafter rank reads it at the end of each step and its
reading travels with the step's loss all-reduce, so every drafter rank holds the same training time and stops,
snapshots and schedules at the same step.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterable

import torch

from dflash_trainer.loop.checkpoint import FILES as CHECKPOINT_FILES
from dflash_trainer.config import TrainConfig, snapshot_name
from dflash_trainer.loop.step import derived_seed, drafter_micro_batch

CLOCK_TICK_ENV = "DFLASH_DEBUG_CLOCK_TICK_S"


def training_clock() -> Callable[[], float]:
    """time.monotonic; with DFLASH_DEBUG_CLOCK_TICK_S=S (a test hook) a clock that advances S seconds at each
    reading, so a test of the time budget under torchrun asserts exact steps whatever this machine's speed."""
    tick = float(os.environ.get(CLOCK_TICK_ENV, "0") or 0)
    if tick <= 0:
        return time.monotonic
    ticks = itertools.count(0.0, tick)
    return lambda: next(ticks)


def snapshot_dir(cfg: TrainConfig, minutes: float) -> str:
    return os.path.join(cfg.output_dir, "snapshots", snapshot_name(minutes))


def pending_snapshots(cfg: TrainConfig) -> list[float]:
    """The snapshot minutes still to take (a resumed run does not take one again whose directory exists)."""
    return [m for m in cfg.snapshot_plan() if not os.path.isdir(snapshot_dir(cfg, m))]


def link_snapshot(checkpoint: str, dst: str) -> None:
    """<output-dir>/snapshots/<M>min: hard links to a checkpoint's files (never rewritten in place, so pruning
    the step dir later leaves the snapshot whole), published by a rename; a copy where links fail."""
    tmp = dst + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in CHECKPOINT_FILES:
        try:
            os.link(os.path.join(checkpoint, name), os.path.join(tmp, name))
        except OSError:
            shutil.copy2(os.path.join(checkpoint, name), os.path.join(tmp, name))
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.rename(tmp, dst)


def keep_snapshot(cfg: TrainConfig, writer, minutes: float, checkpoint: str, *, step: int, train_s: float,
                  epoch: int, sequences: int, dataset_rows: int, metrics: dict) -> str:
    """Keeps `checkpoint` (the weights after the last step) as the snapshot of `minutes` and appends its row to
    snapshots.jsonl (`writer`); `metrics` is the last metrics row (loss, slot_acc, tau_proxy). Returns its dir."""
    dst = snapshot_dir(cfg, minutes)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    link_snapshot(checkpoint, dst)
    writer.write({"minutes": minutes, "step": step, "train_s": round(train_s, 1), "epoch": epoch,
                  "sequences": sequences, "passes": round(sequences / dataset_rows, 2), "loss": metrics.get("loss"),
                  "slot_acc": metrics.get("slot_acc"), "tau_proxy": metrics.get("tau_proxy"), "checkpoint": dst})
    return dst


def compile_warmup(cfg: TrainConfig, drafter, optimizer: torch.optim.Optimizer,
                   micro_batches: Iterable[tuple]) -> int:
    """Forward and backward of each (taps, last, input_ids, loss_mask, lengths), then the gradients are dropped:
    compilation and allocation before the training clock starts, nothing trained. Noise 0 and seeds of its own
    (derived_seed(seed, -1, i)), so the run's RNG state is untouched. The caller gives the micro-batches back
    to the data (one process: restores the loader's position; torchrun: they stay in the queue). Returns the
    count that ran."""
    count = 0
    for i, (taps, last, input_ids, loss_mask, lengths) in enumerate(micro_batches):
        out = drafter_micro_batch(drafter, taps, last, input_ids, loss_mask, lengths, max_anchors=cfg.max_anchors,
                                  gamma=cfg.gamma, noise_amplitude=0.0, seed=derived_seed(cfg.seed, -1, i),
                                  head_chunk_size=cfg.head_chunk_size,
                                  soft_label_temperature=cfg.soft_label_temperature)
        out.loss.backward()
        count += 1
    optimizer.zero_grad(set_to_none=True)
    device = drafter.fc.weight.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return count
