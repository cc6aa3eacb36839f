"""Replayed decoding (dflash-eval --replay): τ of greedy speculative decoding computed from the target's reference
output, without the loop of verification steps.

Greedy speculative decoding that is lossless outputs the target's greedy decode R = r_0 .. r_{N-1} (the reference),
so every step of spec_decode.speculative_decode is known in advance but for the drafts: at an anchor (the last
token kept, at position a of prompt + R) the proposer drafts from the tokens up to a (DFlash: and the target's
tapped states of the positions before a), the target accepts the leading drafts that equal R's next tokens, and the
step keeps them plus the target's next token, up to R's end. A drafter's drafts at every anchor come from one
target forward over prompt + R and one drafter forward over all anchors' blocks at once (the training's block mask:
a block sees the positions before its anchor and itself), so a prompt costs two forwards instead of one target
forward per step (prompt lookup's drafts need no forward at all).

In exact arithmetic the replay is the decode; in floating point the target's states from one forward differ from
the cached step-by-step ones by rounding, which can turn a near-tie the other way: compare with a real decode before
trusting it for a new model (trainer/docs/EVALUATION.md gives the comparison for SmolLM2). Losslessness is not
checked: the replay assumes it (the report says `replayed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from dflash_trainer.eval.spec_decode import DecodeResult
from dflash_trainer.model.blocks import block_inputs, dense_block_mask

ANCHORS_PER_FORWARD = 256  # bounds the drafter forward's block mask: [256 * B, context + 256 * B] booleans


def replay(prompt: list[int], reference: list[int], drafts_at: Callable[[int, list[int], int], list[int]],
           block_size: int, max_new_tokens: int) -> DecodeResult:
    """The DecodeResult speculative_decode would give when its output is `reference`: drafts_at(anchor position,
    tokens up to and including it, how many) gives the proposer's drafts at an anchor."""
    n = len(reference)
    tokens = list(prompt) + list(reference)
    result = DecodeResult(tokens=list(reference), num_target_forwards=1)  # the prefill gives r_0

    def step(kept: int) -> tuple[int, int]:
        """(accept length, drafts offered) of a step whose anchor is R's token kept - 1."""
        anchor = len(prompt) + kept - 1
        draft = drafts_at(anchor, tokens[:anchor + 1], min(block_size - 1, max_new_tokens - kept - 1))
        accepted = 0
        while accepted < len(draft) and kept + accepted < n and draft[accepted] == reference[kept + accepted]:
            accepted += 1
        return min(accepted + 1, n - kept), len(draft)  # the bonus token, or the accepted run cut at R's EOS

    steps = [step(kept) for kept in range(1, n)]  # at every anchor, once: the walk below reads its own from here
    result.anchor_lengths = [length for length, _ in steps]
    kept = 1
    while kept < n:  # the decode stops at R's end: max_new_tokens, or the EOS R ends with
        new, offered = steps[kept - 1]
        result.accept_lengths.append(new)
        result.num_proposed.append(offered)
        result.num_target_forwards += 1
        kept += new
    return result


POSITION_BUCKETS = ((0, 8), (8, 16), (16, 32), (32, 64), (64, None))  # output tokens, by where a step anchors


def accept_length_by_position(results: list[DecodeResult]) -> dict[str, float | None]:
    """Mean accept length of a step anchored at each output position, every position counted (anchor_lengths),
    by bucket of positions: where in a response a drafter drafts well ("0-7": its first tokens)."""
    out = {}
    for lo, hi in POSITION_BUCKETS:
        lengths = [a for r in results for a in r.anchor_lengths[lo:hi]]
        out[f"{lo}-{hi - 1}" if hi else f"{lo}+"] = sum(lengths) / len(lengths) if lengths else None
    return out


def dflash_drafts(model, drafter, prompt: list[int], reference: list[int]) -> torch.Tensor:
    """[N, B-1]: the drafter's drafts (argmax of slots 1..B-1) at the anchor of every reference token, from one
    target forward over prompt + R (but its last token) and drafter forwards of up to ANCHORS_PER_FORWARD blocks."""
    return dflash_drafts_and_target_logits(model, drafter, prompt, reference)[0]


@torch.no_grad()
def dflash_drafts_and_target_logits(model, drafter, prompt: list[int],
                                    reference: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """dflash_drafts' drafts and the logits of its one target forward, [P + N - 1, V] (position i predicts token
    i + 1 of prompt + R), for a caller that also reads the target's own predictions (proofs/slot1_confidence.py)."""
    device = next(model.parameters()).device
    d = drafter
    ids = torch.tensor([list(prompt) + list(reference)], device=device)
    context = ids[:, :-1]  # the last anchor's block sees the positions before it: every token but the last
    out = model(input_ids=context, use_cache=False, output_hidden_states=True)
    taps = [out.hidden_states[i + 1].to(dtype=d.fc.weight.dtype) for i in d.cfg.target_layer_ids]
    T, B, P = context.shape[1], d.cfg.block_size, len(prompt)
    drafts = []
    for start in range(0, len(reference), ANCHORS_PER_FORWARD):
        anchors = torch.arange(P + start, min(P + len(reference), P + start + ANCHORS_PER_FORWARD),
                               device=device)[None]
        valid = torch.ones_like(anchors, dtype=torch.bool)
        block_ids, block_pos = block_inputs(ids, anchors, B, d.cfg.mask_token_id)
        mask = dense_block_mask(anchors, valid, T, B)
        logits = d.logits(d(taps, block_ids, block_pos, mask)[0])  # [A * B, V]
        drafts.append(logits.view(anchors.shape[1], B, -1)[:, 1:].argmax(-1))
    return torch.cat(drafts), out.logits[0]


def replay_dflash(model, drafter, prompt: list[int], reference: list[int], block_size: int,
                  max_new_tokens: int) -> DecodeResult:
    t0 = time.perf_counter()
    drafts = dflash_drafts(model, drafter, prompt, reference).tolist()
    P = len(prompt)
    result = replay(prompt, reference, lambda anchor, _tokens, num: drafts[anchor - P][:num], block_size,
                    max_new_tokens)
    result.wall_s = time.perf_counter() - t0
    return result


def replay_proposer(proposer, prompt: list[int], reference: list[int], block_size: int,
                    max_new_tokens: int) -> DecodeResult:
    """A proposer that drafts from the tokens alone (prompt lookup): its own propose() at every anchor."""
    t0 = time.perf_counter()
    result = replay(prompt, reference, lambda _anchor, tokens, num: proposer.propose(tokens, None, num) if num > 0
                    else [], block_size, max_new_tokens)
    result.wall_s = time.perf_counter() - t0
    return result
