"""Anchors, block inputs, same-position labels and the block-sparse visibility mask (docs/dflash.md).

Legend: B sequences, T padded context length, A anchors per sequence (padded), S block size,
Q = A*S block query positions. Query q belongs to block q // S, slot q % S.
"""

from __future__ import annotations

import functools

import torch


def sample_anchors(loss_mask_BT: torch.Tensor, max_anchors: int, generator: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence, up to max_anchors positions p with loss_mask[p] and loss_mask[p+1], uniformly
    without replacement, sorted. Returns anchors [B, A] (padding 0) and valid [B, A].

    Runs on the CPU with an explicit generator so the draw is reproducible after resume."""
    mask = loss_mask_BT.cpu().bool()
    eligible = mask[:, :-1] & mask[:, 1:]
    per_row = []
    for row in eligible:
        candidates = row.nonzero().squeeze(1)
        if len(candidates) > max_anchors:
            pick = torch.randperm(len(candidates), generator=generator)[:max_anchors]
            candidates = candidates[pick].sort().values
        per_row.append(candidates)
    A = max(1, max(len(c) for c in per_row))
    anchors = torch.zeros(len(per_row), A, dtype=torch.long)
    valid = torch.zeros(len(per_row), A, dtype=torch.bool)
    for b, c in enumerate(per_row):
        anchors[b, :len(c)] = c
        valid[b, :len(c)] = True
    return anchors, valid


def block_inputs(input_ids_BT: torch.Tensor, anchors_BA: torch.Tensor, block_size: int, mask_token_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Block token ids [B, Q]: slot 0 = x_a, slots 1.. = MASK; positions [B, Q] = a + slot."""
    B, A = anchors_BA.shape
    ids = torch.full((B, A, block_size), mask_token_id, dtype=torch.long, device=input_ids_BT.device)
    ids[:, :, 0] = input_ids_BT.gather(1, anchors_BA)
    slots = torch.arange(block_size, device=anchors_BA.device)
    pos = anchors_BA[:, :, None] + slots
    return ids.view(B, A * block_size), pos.view(B, A * block_size)


def block_labels(input_ids_BT: torch.Tensor, loss_mask_BT: torch.Tensor, lengths_B: torch.Tensor,
                 anchors_BA: torch.Tensor, valid_BA: torch.Tensor, block_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Same-position labels: slot k of the block at anchor a predicts x_{a+k} (not x_{a+k+1}).

    Returns labels [B, A, S] and m [B, A, S]: False for slot 0, padded anchors, positions past the end
    of the sequence and tokens outside the loss mask."""
    T = input_ids_BT.shape[1]
    slots = torch.arange(block_size, device=anchors_BA.device)
    pos = anchors_BA[:, :, None] + slots                      # [B, A, S]
    in_range = pos < lengths_B[:, None, None]
    pos_c = pos.clamp(max=T - 1).flatten(1)
    labels = input_ids_BT.gather(1, pos_c).view_as(pos)
    supervised = loss_mask_BT.bool().gather(1, pos_c).view_as(pos)
    m = in_range & supervised & valid_BA[:, :, None] & (slots > 0)
    return labels, m


def slot_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """w_0 = 0, w_k = exp(-(k-1)/gamma): early slots matter most, since acceptance stops at the first miss."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def dense_block_mask(anchors_BA: torch.Tensor, valid_BA: torch.Tensor, T: int, block_size: int) -> torch.Tensor:
    """Boolean [B, 1, Q, T+Q], True = may attend. Context key t is visible to block j iff t < a_j
    (the target's state at a_j is not known when drafting from a_j); block keys only within block j.
    Padded anchors see no context and only their own block (keeps softmax rows non-empty)."""
    B, A = anchors_BA.shape
    Q = A * block_size
    device = anchors_BA.device
    limit = torch.where(valid_BA, anchors_BA, torch.zeros_like(anchors_BA))     # [B, A]
    q_block = torch.arange(Q, device=device) // block_size                       # [Q]
    ctx_ok = torch.arange(T, device=device)[None, None, :] < limit[:, q_block, None]   # [B, Q, T]
    blk_ok = (q_block[:, None] == q_block[None, :]).expand(B, Q, Q)              # [B, Q, Q]
    return torch.cat([ctx_ok, blk_ok], dim=2)[:, None]


def flex_block_mask(anchors_BA: torch.Tensor, valid_BA: torch.Tensor, T: int, block_size: int, make=None):
    """The same rule as dense_block_mask as a flex_attention BlockMask (CUDA): only the visible
    128x128 tiles are computed, so the 1.3 G-entry dense mask of the seed shape never exists. `make` is the
    create_block_mask to use (default: compiled on CUDA, eager elsewhere)."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, A = anchors_BA.shape
    Q = A * block_size
    limit = torch.where(valid_BA, anchors_BA, torch.zeros_like(anchors_BA))

    def mask_mod(b, h, q_idx, kv_idx):
        q_block = q_idx // block_size
        ctx_visible = (kv_idx < T) & (kv_idx < limit[b, q_block])
        own_block = (kv_idx >= T) & ((kv_idx - T) // block_size == q_block)
        return ctx_visible | own_block

    if make is None:
        # Compiled on CUDA: evaluating mask_mod eagerly would materialize the dense Q x (T+Q) grid first.
        make = compiled_create_block_mask() if anchors_BA.device.type == "cuda" else create_block_mask
    return make(mask_mod, B, None, Q, T + Q, device=anchors_BA.device)


@functools.cache
def compiled_flex_attention():
    """Compiled once per process: eager flex_attention materializes the scores and is only for debugging."""
    from torch.nn.attention.flex_attention import flex_attention
    # dynamic=None: shapes vary batch to batch; torch marks them dynamic after the first recompile.
    return torch.compile(flex_attention)


@functools.cache
def compiled_create_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask
    return torch.compile(create_block_mask)


def build_mask(anchors_BA, valid_BA, T: int, block_size: int, use_flex: bool):
    if use_flex:
        return flex_block_mask(anchors_BA, valid_BA, T, block_size)
    return dense_block_mask(anchors_BA, valid_BA, T, block_size)
