"""The one train state: what a checkpoint's train_state.pt holds besides the optimizer (the on-disk format is
checkpoint.py's), what a resume restores, and the RNG capture both take. Saved by loop/bookkeeping.py, restored
by the loop's callers (train.run in one process, dist_ranks.run_drafter under torchrun)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restores rng_state()'s capture; the CUDA generators only where as many GPUs show as when it was taken."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class TrainState:
    """step: optimizer steps done; data: the data position after them (BatchLoader.state_dict(); None under
    torchrun before the first step, where nothing is to be checkpointed yet); train_s: seconds of training clock;
    num_bad_steps: non-finite steps skipped; num_sequences: sequences trained on."""

    step: int = 0
    data: dict | None = None
    train_s: float = 0.0
    num_bad_steps: int = 0
    num_sequences: int = 0

    @classmethod
    def from_checkpoint(cls, saved: dict) -> "TrainState":
        """From a checkpoint's train_state.pt (any world size); restores the RNG it captured."""
        set_rng_state(saved["rng"])
        return cls(step=saved["step"], data=saved["data"], train_s=saved["scheduler"].get("train_s", 0.0),
                   num_bad_steps=saved.get("num_bad_steps", 0), num_sequences=saved.get("num_sequences", 0))

    def to_checkpoint(self, optimizer_state: dict, config: dict, **extra) -> dict:
        """train_state.pt's dict, as checkpoint.save_checkpoint writes it; `extra` (under torchrun: world)."""
        return {"optimizer": optimizer_state, "scheduler": {"train_s": self.train_s}, "data": self.data,
                "rng": rng_state(), "step": self.step, "num_bad_steps": self.num_bad_steps,
                "num_sequences": self.num_sequences, "config": config, **extra}
