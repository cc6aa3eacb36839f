"""The learning-rate and noise schedules: by optimizer steps, or by training time over --time-budget-min.

The lr is a linear warmup over the first --warmup-ratio of the run, then (--lr-schedule) a cosine to 0, or
warmup-stable-decay: the peak held, then linear to 0 over the last --lr-decay-ratio of the run after warmup. The
noise amplitude goes linearly from --noise-start to --noise-end. "The run" is the optimizer steps (epochs, capped by
--max-steps) or, with a time budget, the seconds of training wall clock (compile warm-up excluded).
Pure Python: the loop calls it once per optimizer step.
"""

from __future__ import annotations

import math

from dflash_trainer.config import TrainConfig


def decay_factor(progress: float, shape: str, decay_ratio: float) -> float:
    """Factor of the peak lr at `progress` (0..1) of the run after warmup: cosine, or wsd's hold then linear."""
    progress = min(max(progress, 0.0), 1.0)
    if shape == "wsd":
        return min(1.0, (1.0 - progress) / decay_ratio)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_factor_by_step(step: int, total_steps: int, warmup_steps: int, shape: str,
                      decay_ratio: float) -> float:
    """Factor of the peak lr for the update of optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return decay_factor((step - warmup_steps) / max(1, total_steps - warmup_steps), shape, decay_ratio)


def lr_factor_by_time(frac: float, warmup_ratio: float, shape: str, decay_ratio: float) -> float:
    """Factor of the peak lr at `frac` of the time budget (never 0 in warmup: the first step moves)."""
    if frac < warmup_ratio:
        return max(frac / warmup_ratio, 1e-3)
    return decay_factor((frac - warmup_ratio) / (1.0 - warmup_ratio), shape, decay_ratio)


class Schedule:
    def __init__(self, cfg: TrainConfig, total_steps: int):
        self.cfg = cfg
        self.total_steps = total_steps
        self.warmup_steps = max(1, math.ceil(cfg.warmup_ratio * total_steps))
        self.budget_s = None if cfg.time_budget_min is None else cfg.time_budget_min * 60.0

    def lr(self, step: int, train_s: float) -> float:
        cfg = self.cfg
        if self.budget_s is None:
            return cfg.lr * lr_factor_by_step(step, self.total_steps, self.warmup_steps, cfg.lr_schedule,
                                              cfg.lr_decay_ratio)
        return cfg.lr * lr_factor_by_time(train_s / self.budget_s, cfg.warmup_ratio, cfg.lr_schedule,
                                          cfg.lr_decay_ratio)

    def noise(self, step: int, train_s: float) -> float:
        cfg = self.cfg
        if cfg.noise == "none":
            return 0.0
        if self.budget_s is None:
            frac = 1.0 if self.total_steps <= 1 else step / (self.total_steps - 1)
        else:
            frac = train_s / self.budget_s
        return cfg.noise_start + (cfg.noise_end - cfg.noise_start) * min(max(frac, 0.0), 1.0)

    def budget_spent(self, train_s: float) -> bool:
        return self.budget_s is not None and train_s >= self.budget_s

    def describe(self) -> str:
        after = "cosine" if self.cfg.lr_schedule == "cosine" else (
            f"the peak held, then linear to 0 over the last {self.cfg.lr_decay_ratio:g} of the rest (wsd)")
        if self.budget_s is None:
            return f"by steps: warmup {self.warmup_steps} of {self.total_steps}, then {after}"
        return (f"by training time: {self.cfg.time_budget_min:g} min, warmup {self.cfg.warmup_ratio:g} of it, then "
                f"{after} (steps capped at {self.total_steps} by --epochs/--max-steps)")
