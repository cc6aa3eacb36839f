"""FP8 training of the drafter layers' linears (torchao's float8 training, rowwise scales): an opt-in speed lever
(DFLASH_FP8_LAYERS=1 or a recipe name), not the default until the SmolLM2 proof's tau holds with it (issue 15).

The frozen head, the embedding and fc stay bf16. Parameter names and dtypes are unchanged (torchao's Float8Linear
keeps an fp32 `weight`), so checkpoints and exports are the same files."""

from __future__ import annotations

import importlib

from torch import nn


def float8_layers(drafter: nn.Module, recipe: str = "rowwise") -> int:
    """Swaps every nn.Linear inside drafter.layers for torchao's Float8Linear with that recipe's scaling (rowwise:
    one scale per row, tensorwise: one per tensor; before torch.compile). Returns how many were swapped. A missing
    torchao is one line naming the fix."""
    try:
        float8 = importlib.import_module("torchao.float8")
    except ImportError as exc:
        raise RuntimeError(f"DFLASH_FP8_LAYERS ({recipe}) needs torchao ({exc}); pip install 'dflash_trainer[fp8]' or unset "
                           "DFLASH_FP8_LAYERS") from None
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    before = sum(isinstance(m, nn.Linear) for m in drafter.layers.modules())
    float8.convert_to_float8_training(drafter.layers, config=config)
    return before - sum(type(m) is nn.Linear for m in drafter.layers.modules())
