"""The weights a new run starts from, when there is no checkpoint to resume: the seeded random init, --init-drafter's
(a warm start from an export or checkpoint of the same drafter) or --init-layers-from-target's (the drafter's layers
copied from evenly spaced target layers, model/from_target.py). The single process (loop/train.py) and every torchrun
drafter rank (distributed/ranks.py) choose here and apply with `apply`, so both start alike."""

from __future__ import annotations

import dataclasses
import json
import os

import torch
from safetensors.torch import load_file

from dflash_trainer.config import StartupError, TrainConfig
from dflash_trainer.export.exporter import drafter_config_from_export
from dflash_trainer.loop.checkpoint import load_checkpoint
from dflash_trainer.model.drafter import DrafterConfig


@dataclasses.dataclass
class StartingWeights:
    state: dict[str, torch.Tensor]
    partial: bool  # only some tensors; the others keep the seeded random init
    words: str  # the log line


def starting_weights(cfg: TrainConfig, drafter_cfg: DrafterConfig) -> StartingWeights | None:
    """What a new run of `cfg` starts from (None: the seeded random init). StartupError, before any weights load,
    when the flag's source does not fit this drafter."""
    if cfg.init_drafter:
        return StartingWeights(initial_weights(cfg.init_drafter, drafter_cfg), False,
                               f"warm start from {cfg.init_drafter}")
    if cfg.init_layers_from_target:
        from dflash_trainer.model.from_target import layers_from_target
        try:
            state, words = layers_from_target(cfg.target_model, drafter_cfg)
        except ValueError as e:
            raise StartupError(str(e)) from None
        return StartingWeights(state, True, words)
    return None


def apply(drafter, start: StartingWeights | None) -> None:
    if start is not None:
        drafter.load_trainable_state_dict(start.state, partial=start.partial)


def initial_weights(path: str, cfg: DrafterConfig) -> dict[str, torch.Tensor]:
    """--init-drafter: the trainable weights of an export dir or a checkpoints/step-N dir, for a drafter built
    exactly like `cfg` (a warm start, e.g. from the export of an earlier session's run). StartupError otherwise."""
    if _init_drafter_config(path, cfg) == "export":
        return {k: v.float() for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
    return load_checkpoint(path)[0]


def check_starting_weights(cfg: TrainConfig, drafter_cfg: DrafterConfig) -> None:
    """What starting_weights refuses, from the configs and the target's safetensors headers (no tensor read): for
    `dflash-train --check`, which runs before a live run is stopped. StartupError with the refusal's line."""
    if cfg.init_drafter:
        _init_drafter_config(cfg.init_drafter, drafter_cfg)
    if cfg.init_layers_from_target:
        from dflash_trainer.model.from_target import plan_layers_from_target
        try:
            plan_layers_from_target(cfg.target_model, drafter_cfg)
        except ValueError as e:
            raise StartupError(str(e)) from None


def _init_drafter_config(path: str, cfg: DrafterConfig) -> str:
    """Which kind of dir --init-drafter names ("export" or "checkpoint"), after checking that its drafter is built
    exactly like `cfg`; StartupError otherwise."""
    if os.path.isfile(os.path.join(path, "config.json")) and os.path.isfile(os.path.join(path, "model.safetensors")):
        with open(os.path.join(path, "config.json")) as f:
            other, kind = drafter_config_from_export(json.load(f)), "export"
    elif os.path.isfile(os.path.join(path, "drafter_config.json")):
        with open(os.path.join(path, "drafter_config.json")) as f:
            other, kind = DrafterConfig.from_dict(json.load(f)), "checkpoint"
    else:
        raise StartupError(f"--init-drafter {path} is neither an export dir (config.json + model.safetensors) nor "
                           "a checkpoints/step-N dir; pass one of those")
    mine, theirs = cfg.to_dict(), other.to_dict()
    mine.pop("split_fc_layers", None), theirs.pop("split_fc_layers", None)  # how fc is applied, not what it holds
    diff = [f"{k} {theirs.get(k)} there, {v} here" for k, v in mine.items() if theirs.get(k) != v]
    if diff:
        raise StartupError(f"--init-drafter {path} is another drafter ({'; '.join(diff)}); use the same "
                           "--num-draft-layers, --block-size, --num-target-taps/--target-layer-ids, "
                           "--mask-token-id and target")
    return kind
