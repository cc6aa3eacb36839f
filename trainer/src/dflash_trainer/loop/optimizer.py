"""The drafter's optimizer, built in one place for dflash-train (one process and torchrun) and the step benchmark."""

from __future__ import annotations

import torch


def drafter_adamw(params, lr: float, weight_decay: float, device: torch.device | str,
                  sharded: bool = False) -> torch.optim.AdamW:
    """AdamW; on CUDA the fused kernel (one pass over every parameter instead of a chain of foreach kernels),
    except for FSDP's sharded (DTensor) parameters, which keep the default foreach implementation. Checkpoints
    move between the two: the state has the same entries."""
    fused = torch.device(device).type == "cuda" and not sharded
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True if fused else None)
