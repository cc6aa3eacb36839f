"""One micro-batch: anchors -> block inputs -> visibility mask -> drafter -> chunked loss.

Shared by the training loop and trainer/benchmarks/train_step.py, so the benchmark times the real code.
"""

from __future__ import annotations

import contextlib
import math
import zlib

import torch
import torch.nn.functional as F

from dflash_trainer.model.blocks import block_inputs, build_mask, sample_anchors
from dflash_trainer.model.drafter import DFlashDrafter
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
                        head_chunk_size: int | None, soft_label_temperature: float,
                        tile_shapes: bool | None = None) -> LossOutput:
    """Forward + loss for one micro-batch (the caller runs backward). Everything random is drawn from
    generators seeded by `seed`, so a resumed run reproduces the uninterrupted one exactly. `tile_shapes`
    (default: on CUDA, where flex attention runs) pads the shapes to whole attention tiles (pad_to_tiles)."""
    cfg = drafter.cfg
    device = drafter.fc.weight.device
    use_flex = device.type == "cuda"
    anchors, valid = sample_anchors(loss_mask_BT, max_anchors, torch.Generator().manual_seed(seed))
    anchors, valid = anchors.to(device), valid.to(device)
    input_ids_BT, loss_mask_BT, lengths_B = input_ids_BT.to(device), loss_mask_BT.to(device), lengths_B.to(device)
    taps = [t.to(device, non_blocking=True) for t in taps]
    if target_last is not None:
        target_last = target_last.to(device, non_blocking=True)
    if noise_amplitude > 0:
        noise_gen = torch.Generator(device=device).manual_seed(seed + 1)
        taps = add_uniform_noise(taps, noise_amplitude, noise_gen)
    if use_flex if tile_shapes is None else tile_shapes:  # after the noise, whose draws follow the unpadded shape
        taps, target_last, input_ids_BT, loss_mask_BT, anchors, valid = pad_to_tiles(
            taps, target_last, input_ids_BT, loss_mask_BT, anchors, valid, cfg.block_size)
    block_ids, block_pos = block_inputs(input_ids_BT, anchors, cfg.block_size, cfg.mask_token_id)
    T = input_ids_BT.shape[1]
    mask = build_mask(anchors, valid, T, cfg.block_size, use_flex=use_flex)
    with autocast_for(device):
        hidden = drafter(taps, block_ids, block_pos, mask)
    return dflash_loss(hidden, drafter.lm_head.weight, input_ids_BT, loss_mask_BT, lengths_B, anchors, valid,
                       cfg.block_size, gamma, target_last_BTH=target_last, chunk=head_chunk_size,
                       soft_label_temperature=soft_label_temperature)


FLEX_TILE = 128  # flex attention's default block size (query and key tiles)


def pad_to_tiles(taps, target_last, input_ids_BT, loss_mask_BT, anchors_BA, valid_BA, block_size: int,
                 tile: int = FLEX_TILE):
    """Pads the context to a multiple of `tile` positions and the anchors to a count whose block queries
    fill whole tiles, so every batch's attention lengths are tile multiples. Compiled flex attention guards
    on whether its lengths divide the tile: batches of arbitrary lengths flipped those guards, recompiling
    the drafter layers until dynamo's recompile limit (8) and then running them eagerly (run 6 of the proof).
    The block queries fill at least two tiles: dynamo specializes a size of 1, and block queries filling one
    tile compiled graphs of their own inside the training clock (run 8). A batch of one sequence is left as it
    is (an empty second sequence doubled its work: 1,224 -> 1,739 ms and 75 -> 111 GB per step at the seed's
    shape); its graph is compiled by the compile warm-up, whose batches include the plan's fewest sequences.
    The padding changes nothing computed: padded context positions lie past every anchor, so no block sees
    them, and padded anchors are invalid (no context, no loss). Costs < `tile` positions and a few anchors."""
    T, A = input_ids_BT.shape[1], anchors_BA.shape[1]
    pad_t = -T % tile
    anchor_multiple = tile // math.gcd(tile, block_size)  # anchor counts whose block queries fill whole tiles
    need_a = max(A, -(-2 * tile // block_size))  # and at least two of them
    pad_a = -(-need_a // anchor_multiple) * anchor_multiple - A
    if pad_t:
        taps = [F.pad(t, (0, 0, 0, pad_t)) for t in taps]
        target_last = None if target_last is None else F.pad(target_last, (0, 0, 0, pad_t))
        input_ids_BT, loss_mask_BT = F.pad(input_ids_BT, (0, pad_t)), F.pad(loss_mask_BT, (0, pad_t))
    if pad_a:
        anchors_BA, valid_BA = F.pad(anchors_BA, (0, pad_a)), F.pad(valid_BA, (0, pad_a))
    return taps, target_last, input_ids_BT, loss_mask_BT, anchors_BA, valid_BA
