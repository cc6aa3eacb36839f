"""FP8 training of the drafter layers' linears (torchao's float8 training), the default where it pays.

Measured on one H200 (trainer/README.md "Speed (issue 15)"): at the seed's shape (hidden 5120) tensorwise scales
ran the drafter step 1.20x faster than bf16 (918.7 against 1,101.4 ms), rowwise 1.13x; at SmolLM2's (hidden 576)
the matmuls are too small to gain and the proof made 7 % fewer steps in its 10 minutes, its tau 2.93 against 2.97
in bf16. So DFLASH_FP8_LAYERS=auto (the default) takes tensorwise on an FP8-capable GPU from a hidden size of
FP8_MIN_HIDDEN on, when torchao is installed (pip install 'dflash_trainer[fp8]'), else bf16, and says which.

The frozen head, the embedding and fc stay bf16. Parameter names and dtypes are unchanged (torchao's Float8Linear
keeps an fp32 `weight`), so checkpoints and exports are the same files."""

from __future__ import annotations

import importlib
import importlib.util

import torch
from torch import nn

# The smallest drafter hidden size auto puts in FP8: measured gains at 5120, losses at 576 (none measured between).
FP8_MIN_HIDDEN = 4096
FP8_AUTO_RECIPE = "tensorwise"   # the faster of the two at 5120, and the one the proof's tau was checked with


def choose_fp8(setting: str | None, device_type: str, capability: tuple[int, int] | None, hidden_size: int,
               torchao_present: bool) -> tuple[str | None, str]:
    """(torchao recipe or None for bf16, why: the words of dflash-train's `drafter linears:` line).
    setting: DFLASH_FP8_LAYERS as parsed (auto, None for 0, or a recipe)."""
    if setting is None:
        return None, "bf16 (DFLASH_FP8_LAYERS=0)"
    if device_type != "cuda":
        return None, f"bf16 (DFLASH_FP8_LAYERS={setting}: FP8 only on CUDA)"
    if setting != "auto":
        return setting, f"FP8 {setting} (DFLASH_FP8_LAYERS={setting})"
    if capability is None or capability < (8, 9):
        return None, f"bf16 (auto: compute capability {capability} has no FP8 matmul; 8.9 or newer does)"
    if hidden_size < FP8_MIN_HIDDEN:
        return None, f"bf16 (auto: hidden {hidden_size} < {FP8_MIN_HIDDEN}, too small for FP8 to pay)"
    if not torchao_present:
        return None, "bf16 (auto: torchao is not installed; pip install 'dflash_trainer[fp8]' for FP8 linears)"
    return FP8_AUTO_RECIPE, f"FP8 {FP8_AUTO_RECIPE} (auto: hidden {hidden_size} >= {FP8_MIN_HIDDEN})"


def fp8_for(setting: str | None, device: torch.device, hidden_size: int) -> tuple[str | None, str]:
    """choose_fp8 for this device and environment."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return choose_fp8(setting, device.type, capability, hidden_size, importlib.util.find_spec("torchao") is not None)


def float8_layers(drafter: nn.Module, recipe: str) -> int:
    """Swaps every nn.Linear inside drafter.layers for torchao's Float8Linear with that recipe's scaling (rowwise:
    one scale per row, tensorwise: one per tensor; before torch.compile). Returns how many were swapped. A missing
    torchao is one line naming the fix."""
    try:
        float8 = importlib.import_module("torchao.float8")
    except ImportError as exc:
        raise RuntimeError(f"DFLASH_FP8_LAYERS ({recipe}) needs torchao ({exc}); pip install 'dflash_trainer[fp8]' "
                           "or unset DFLASH_FP8_LAYERS") from None
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    before = sum(isinstance(m, nn.Linear) for m in drafter.layers.modules())
    float8.convert_to_float8_training(drafter.layers, config=config)
    return before - sum(type(m) is nn.Linear for m in drafter.layers.modules())
