"""One micro-batch: anchors -> block inputs -> visibility mask -> drafter -> chunked loss.

Shared by the training loop and trainer/benchmarks/train_step.py, so the benchmark times the real code.
"""

from __future__ import annotations

import contextlib
import zlib

import torch

from dflash_trainer.blocks import block_inputs, build_mask, sample_anchors
from dflash_trainer.drafter import DFlashDrafter
from dflash_trainer.loss import LossOutput, add_uniform_noise, dflash_loss


def derived_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (hash() of ints would do, but this documents the intent)."""
    return zlib.crc32(",".join(str(p) for p in parts).encode()) * 2654435761 % (2**63)


def autocast_for(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()  # CPU: fp32 throughout (bf16 CPU matmuls are slower and inexact)


def drafter_micro_batch(drafter: DFlashDrafter, taps: list[torch.Tensor], target_last: torch.Tensor | None,
                        input_ids_BT: torch.Tensor, loss_mask_BT: torch.Tensor, lengths_B: torch.Tensor, *,
                        max_anchors: int, gamma: float, noise_amplitude: float, seed: int,
                        head_chunk_size: int) -> LossOutput:
    """Forward + loss for one micro-batch (the caller runs backward). Everything random is drawn from
    generators seeded by `seed`, so a resumed run reproduces the uninterrupted one exactly."""
    cfg = drafter.cfg
    device = drafter.fc.weight.device
    anchors, valid = sample_anchors(loss_mask_BT, max_anchors, torch.Generator().manual_seed(seed))
    anchors, valid = anchors.to(device), valid.to(device)
    input_ids_BT, loss_mask_BT, lengths_B = input_ids_BT.to(device), loss_mask_BT.to(device), lengths_B.to(device)
    taps = [t.to(device, non_blocking=True) for t in taps]
    if target_last is not None:
        target_last = target_last.to(device, non_blocking=True)
    if noise_amplitude > 0:
        noise_gen = torch.Generator(device=device).manual_seed(seed + 1)
        taps = add_uniform_noise(taps, noise_amplitude, noise_gen)
    block_ids, block_pos = block_inputs(input_ids_BT, anchors, cfg.block_size, cfg.mask_token_id)
    T = input_ids_BT.shape[1]
    mask = build_mask(anchors, valid, T, cfg.block_size, use_flex=device.type == "cuda")
    with autocast_for(device):
        hidden = drafter(taps, block_ids, block_pos, mask)
    return dflash_loss(hidden, drafter.lm_head.weight, input_ids_BT, loss_mask_BT, lengths_B, anchors, valid,
                       cfg.block_size, gamma, target_last_BTH=target_last, chunk=head_chunk_size)
