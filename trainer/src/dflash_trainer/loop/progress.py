"""The training loop's profile and progress reports: seconds per phase (profile.jsonl, the log, W&B) and the
step, loss and speed the heartbeat shows. One process: telemetry.Profiler, and the heartbeat directly. A torchrun
rank: RankProgress (one row per rank in the job's profile.jsonl and the job's store, where rank 0 reads every
rank's for the heartbeat), the first drafter rank's step in the store (PROGRESS), W&B profiles of every rank."""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import ExitStack

import torch

from dflash_trainer.telemetry.writers import JsonlWriter, Profiler, profile_line

PROGRESS = "dflash/progress"
RANK_PROGRESS = "dflash/rank/"  # + rank: that rank's last RankProgress row


def _on_success(action):
    """An ExitStack exit callback that runs `action` only when the block ended without an exception."""
    def exit_(exc_type, exc, tb):
        if exc_type is None:
            action()
        return False
    return exit_


class LocalProfile:
    """One process: Profiler's rows every DFLASH_PROFILE_INTERVAL seconds and at the end (with W&B's profile and
    GPU figures), the heartbeat's step, epoch, loss and tokens/s after every step."""

    def __init__(self, stack: ExitStack, cfg, say, heartbeat, wandb_run, nvml):
        self.profiler = Profiler(cfg.run_dir, cfg.profile_interval, say)
        stack.callback(self.profiler.close)
        self.heartbeat, self.wandb_run, self.nvml, self.step = heartbeat, wandb_run, nvml, 0
        stack.push(_on_success(self._last_row))

    def add(self, name: str, seconds: float) -> None:
        self.profiler.add(name, seconds)

    def after_step(self, state, agreed, tokens: int, items: int, seconds: float, depth: int,
                   eta_fields: dict) -> None:
        """After optimizer step `state.step`: `agreed` (reducers.Agreed), this rank's tokens and micro-batches,
        the run's progress (eta.Eta's fields)."""
        self.step = state.step
        self.heartbeat.update(step=state.step, epoch=state.data["epoch"], loss=agreed.loss,
                              tokens_per_s=agreed.tokens / max(seconds, 1e-9), **eta_fields)

    def after_metrics(self, state, tokens: int) -> None:
        self.profiler.tokens += tokens
        if self.profiler.maybe_write(state.step) is not None and self.wandb_run is not None:
            self.wandb_run.profile(self.profiler.last_row)
            self.wandb_run.gpus(state.step, self.nvml.latest)

    def _last_row(self) -> None:
        self.profiler.maybe_write(self.step, force=True)
        if self.wandb_run is not None:
            self.wandb_run.profile(self.profiler.last_row)


class RankProgress:
    """This rank's counters (cumulative): the last step it worked on, items (micro-batches) sent or trained,
    tokens, tokens/s since the rank started training, and seconds per phase (target: data, target forward, send =
    waiting to hand taps to the transfer, transfer = hand-off to transfer complete, overlapping the next forward;
    drafter: queue_wait, drafter_fwd_bwd, optimizer = clipping, the loss all-reduce and the update, step,
    checkpoint). Every update goes to the job's store, where rank 0 reads every rank's for the heartbeat's `ranks`
    (a stalled rank's step and time stay behind); a row goes to <run-dir>/profile.jsonl and the log every
    DFLASH_PROFILE_INTERVAL seconds (0: every update, not logged) and at the end. Rows carry "rank" and "role" (one
    file for the whole job, each row one append; benchmarks/pipeline.py reads its stage timings from it)."""

    def __init__(self, world, cfg, say):
        self.world, self.interval_s, self.say = world, cfg.profile_interval, say
        self.writer = JsonlWriter(os.path.join(cfg.run_dir, "profile.jsonl"))
        self.row = {"rank": world.rank, "role": world.role, "step": 0, "items": 0, "tokens": 0, "seconds": {}}
        self._lock = threading.Lock()
        self._last_write = 0.0
        self._start = time.time()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.row["seconds"][name] = round(self.row["seconds"].get(name, 0.0) + seconds, 6)

    def update(self, force: bool = False, **fields) -> None:
        with self._lock:
            self.row.update(fields, time=time.time())
            self.row["tokens_per_s"] = round(self.row["tokens"] / max(self.row["time"] - self._start, 1e-9), 1)
            if self.world.device.type == "cuda":
                self.row["cuda_max_allocated_mb"] = round(torch.cuda.max_memory_allocated(self.world.device) / 2**20)
            payload = json.dumps(self.row)
            if force or self.row["time"] - self._last_write >= self.interval_s:
                self._last_write = self.row["time"]
                self.writer.write(self.row)
                if force or self.interval_s > 0:
                    self.say(profile_line(self.row))
        try:
            self.world.store.set(RANK_PROGRESS + str(self.world.rank), payload)
        except Exception:  # noqa: BLE001 - the heartbeat misses one update; training goes on
            pass

    def close(self) -> None:
        self.writer.close()


def wandb_job_profile(wandb_run, world, step: int, nvml) -> None:
    """Every rank's last progress row (from the store, as the heartbeat reads them) and this rank's GPUs."""
    for r in range(world.world_size):
        key = RANK_PROGRESS + str(r)
        if world.store.check([key]):
            wandb_run.profile(json.loads(world.store.get(key)), step)
    wandb_run.gpus(step, nvml.latest)


class RankProfile:
    """A torchrun drafter rank: its RankProgress, the job's progress in the store (first drafter rank), W&B's
    profile of every rank every DFLASH_PROFILE_INTERVAL seconds (first drafter rank)."""

    def __init__(self, progress: RankProgress, world, cfg, wandb_run, nvml):
        self.progress, self.world, self.cfg, self.wandb_run, self.nvml = progress, world, cfg, wandb_run, nvml
        self.wandb_profiled = time.time()

    def add(self, name: str, seconds: float) -> None:
        self.progress.add(name, seconds)

    def after_step(self, state, agreed, tokens: int, items: int, seconds: float, depth: int,
                   eta_fields: dict) -> None:
        p = self.progress
        p.add("step", seconds)
        p.update(step=state.step, items=p.row["items"] + items, tokens=p.row["tokens"] + tokens,
                 step_s=round(seconds, 6), queue_depth=depth)
        if self.world.is_drafter_leader:
            self.world.store.set(PROGRESS, json.dumps({"step": state.step, "epoch": state.data["epoch"],
                                                       "loss": agreed.loss,
                                                       "tokens_per_s": agreed.tokens / max(seconds, 1e-9),
                                                       "queue_depth": depth, **eta_fields}))

    def after_metrics(self, state, tokens: int) -> None:
        if self.wandb_run is not None and time.time() - self.wandb_profiled >= self.cfg.profile_interval:
            self.wandb_profiled = time.time()
            wandb_job_profile(self.wandb_run, self.world, state.step, self.nvml)
