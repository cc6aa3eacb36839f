"""The DFlash objective: gamma-weighted, chunked head + loss, hard CE or soft KL, and its metrics.

The frozen lm_head is applied `chunk` rows at a time inside one autograd Function that computes the
loss and, in the same pass, the gradient w.r.t. the drafter's hidden states (the head is frozen, so
no weight gradient is needed). Full-vocabulary logits exist for one chunk at a time only, and the
backward costs no second head forward: 2 head matmuls per row in total (forward + input gradient).

Legend: N supervised rows, H hidden, V vocabulary.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash_trainer.model.blocks import block_labels, slot_weights
from dflash_trainer.config import HEAD_CHUNK_BYTES, HEAD_CHUNK_MAX_ROWS


def _hard_chunk(h, weight_VH, y, w, need_grad: bool, temperature: float):
    """CE against the data token for one chunk: (Σ w·ℓ, top-1 correct, d(Σ w·ℓ)/dh or None). `temperature` is
    unused (one signature with _soft_chunk): a token has no distribution to sharpen."""
    logp = torch.log_softmax((h @ weight_VH.T).float(), dim=-1)              # [n, V]
    total = -(logp.gather(1, y[:, None]).squeeze(1) * w).sum()
    correct = logp.argmax(-1) == y
    if not need_grad:
        return total, correct, None
    dlogits = logp.exp().scatter_add(1, y[:, None], -torch.ones_like(logp[:, :1]))
    return total, correct, (dlogits * w[:, None]).to(weight_VH.dtype) @ weight_VH


def _soft_chunk(h, weight_VH, t, w, need_grad: bool, temperature: float):
    """KL(p_target || p_draft) for one chunk, the target distribution being softmax(t @ W.T / temperature)."""
    logp = torch.log_softmax((h @ weight_VH.T).float(), dim=-1)
    logq = torch.log_softmax((t @ weight_VH.T).float() / temperature, dim=-1)
    q = logq.exp()
    total = ((q * (logq - logp)).sum(-1) * w).sum()
    correct = logp.argmax(-1) == logq.argmax(-1)
    if not need_grad:
        return total, correct, None
    return total, correct, ((logp.exp() - q) * w[:, None]).to(weight_VH.dtype) @ weight_VH


def head_chunk_rows(vocab: int, requested: int | None = None) -> int:
    """Rows per head chunk: `requested` (--head-chunk-size) when given, else the most rows (a power of two, at
    most HEAD_CHUNK_MAX_ROWS) whose fp32 logits fit HEAD_CHUNK_BYTES, so the head's transient memory is bounded
    whatever the vocabulary (1024 rows at the seed's 248,320, 4096 at SmolLM2's 49,152)."""
    if requested is not None:
        return requested
    rows = HEAD_CHUNK_MAX_ROWS
    while rows > 1 and rows * vocab * 4 > HEAD_CHUNK_BYTES:
        rows //= 2
    return rows


def describe_head_chunk(vocab: int, requested: int | None) -> str:
    """The words of dflash-train's `head chunk:` log line."""
    rows = head_chunk_rows(vocab, requested)
    if requested is not None:
        return f"{rows} rows (--head-chunk-size)"
    return f"{rows} rows (default: fp32 logits within {HEAD_CHUNK_BYTES >> 20} MiB at vocab {vocab})"


def describe_labels(cfg) -> str:
    """The words of dflash-train's labels in its `drafter:` log line: hard, soft, or soft at a temperature."""
    if not cfg.use_soft_labels:
        return "hard"
    return "soft" if cfg.soft_label_temperature == 1.0 else f"soft (temperature {cfg.soft_label_temperature:g})"


@functools.cache
def _compiled(fn):
    # Fixed chunk shapes (the last chunk is padded), so each variant compiles once per process.
    return torch.compile(fn, dynamic=False)


def compile_head_loss(device: torch.device) -> bool:
    """Fused chunk kernels on CUDA: eager runs ~10 separate passes over each [chunk, V] fp32 block
    (log_softmax, exp, gather, scatter, casts), which cost more than the head matmuls themselves.
    DFLASH_EAGER_HEAD_LOSS=1 turns it off (debugging, and the benchmark's eager reference)."""
    return device.type == "cuda" and os.environ.get("DFLASH_EAGER_HEAD_LOSS", "") != "1"


class _ChunkedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, labels_N, row_w_N, target_NH, chunk: int, temperature: float):
        need_grad = ctx.needs_input_grad[0]
        N = hidden_NH.shape[0]
        soft = target_NH is not None
        fn = _soft_chunk if soft else _hard_chunk
        compiled = compile_head_loss(hidden_NH.device)
        if compiled:
            fn = _compiled(fn)
        total = torch.zeros((), dtype=torch.float32, device=hidden_NH.device)
        correct = torch.zeros(N, dtype=torch.bool, device=hidden_NH.device)
        grad = torch.empty_like(hidden_NH) if need_grad else None
        for s in range(0, N, chunk):
            e = min(s + chunk, N)
            h = hidden_NH[s:e].to(weight_VH.dtype)
            other = target_NH[s:e].to(weight_VH.dtype) if soft else labels_N[s:e]
            w = row_w_N[s:e].float()
            if compiled and e - s < chunk:  # pad to the fixed shape; padded rows weigh 0 and are dropped
                pad = chunk - (e - s)
                h, w = F.pad(h, (0, 0, 0, pad)), F.pad(w, (0, pad))
                other = F.pad(other, (0, 0, 0, pad) if soft else (0, pad))
            part, ok, g = fn(h, weight_VH, other, w, need_grad, temperature)
            total += part
            correct[s:e] = ok[:e - s]
            if need_grad:
                grad[s:e] = g[:e - s].to(grad.dtype)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(correct)
        return total, correct

    @staticmethod
    def backward(ctx, grad_total, grad_correct):
        (grad,) = ctx.saved_tensors
        return grad * grad_total.to(grad.dtype), None, None, None, None, None, None


def chunked_head_loss(hidden_NH, weight_VH, labels_N, row_w_N, target_NH=None, chunk: int | None = None,
                      temperature: float = 1.0):
    """Σ_rows w·ℓ (not normalized) and per-row top-1 correctness. ℓ = CE(labels) or KL(target || draft)
    where the target distribution is softmax(target_NH @ weight.T / temperature) (1.0: the target's own; the
    flag's value comes from --soft-label-temperature). chunk None: head_chunk_rows' default."""
    rows = head_chunk_rows(weight_VH.shape[0], chunk)
    return _ChunkedHeadLoss.apply(hidden_NH, weight_VH, labels_N, row_w_N, target_NH, rows, float(temperature))


def reference_head_loss(hidden_NH, weight_VH, labels_N, row_w_N, target_NH=None, temperature: float = 1.0):
    """Unchunked, autograd-only version of chunked_head_loss, for tests."""
    logits = hidden_NH.float() @ weight_VH.float().T
    if target_NH is None:
        per_row = F.cross_entropy(logits, labels_N, reduction="none")
    else:
        logq = torch.log_softmax(target_NH.float() @ weight_VH.float().T / temperature, dim=-1)
        per_row = F.kl_div(torch.log_softmax(logits, -1), logq, log_target=True, reduction="none").sum(-1)
    return (per_row * row_w_N).sum()


@dataclass
class LossOutput:
    loss: torch.Tensor            # scalar, Σ w·m·ℓ / Σ w·m
    slot_correct: torch.Tensor    # [S] correct predictions per slot (unweighted counts)
    slot_count: torch.Tensor      # [S] supervised positions per slot
    num_rows: int


def dflash_loss(hidden_BQH, lm_head_weight, input_ids_BT, loss_mask_BT, lengths_B, anchors_BA, valid_BA,
                block_size: int, gamma: float, target_last_BTH=None, chunk: int | None = None,
                soft_label_temperature: float = 1.0) -> LossOutput:
    """The docs/dflash.md objective for one micro-batch of drafter outputs.

    target_last_BTH: the target's final-normed last hidden state; given -> soft labels from index a+k-1, the
    target's logits divided by soft_label_temperature."""
    B, A = anchors_BA.shape
    labels, m = block_labels(input_ids_BT, loss_mask_BT, lengths_B, anchors_BA, valid_BA, block_size)
    w_S = slot_weights(block_size, gamma, device=hidden_BQH.device)
    row_w = (w_S * m).flatten()                                  # [B*A*S]
    keep = m.flatten().nonzero().squeeze(1)                      # only supervised rows reach the head
    hidden = hidden_BQH.reshape(B * A * block_size, -1)[keep]
    target = None
    if target_last_BTH is not None:
        # The target's distribution for x_{a+k} comes from its state at a+k-1.
        pos = (anchors_BA[:, :, None] + torch.arange(block_size, device=anchors_BA.device) - 1).clamp(min=0)
        flat = (pos + torch.arange(B, device=pos.device)[:, None, None] * target_last_BTH.shape[1]).flatten()[keep]
        target = target_last_BTH.reshape(-1, target_last_BTH.shape[-1])[flat]
    total, correct = chunked_head_loss(hidden, lm_head_weight, labels.flatten()[keep], row_w[keep], target, chunk,
                                       soft_label_temperature)
    denom = row_w.sum().clamp(min=1e-6)
    slot = keep % block_size
    slot_correct = torch.zeros(block_size, device=hidden.device).index_add_(0, slot, correct.float())
    slot_count = torch.zeros(block_size, device=hidden.device).index_add_(
        0, slot, torch.ones_like(slot, dtype=torch.float32))
    return LossOutput(total / denom, slot_correct, slot_count, int(keep.numel()))


def acceptance_proxy(slot_acc: list[float]) -> float:
    """Expected acceptance length 1 + Σ_k Π_{j<=k} acc_j over slots 1..S-1 (slot 0 is the given token)."""
    tau, run = 1.0, 1.0
    for acc in slot_acc[1:]:
        run *= acc
        tau += run
    return tau


def noise_amplitude(step: int, total_steps: int, start: float, end: float) -> float:
    """Linear schedule from start (step 0) to end (last step)."""
    if total_steps <= 1:
        return end
    frac = min(max(step / (total_steps - 1), 0.0), 1.0)
    return start + (end - start) * frac


def add_uniform_noise(taps: list[torch.Tensor], amplitude: float, generator: torch.Generator | None) -> list[torch.Tensor]:
    """U(-amplitude, amplitude) added to each tapped feature (absolute units, as in speculators)."""
    if amplitude <= 0:
        return taps
    out = []
    for t in taps:
        u = torch.rand(t.shape, generator=generator, device=t.device, dtype=torch.float32)
        out.append(t + ((2 * u - 1) * amplitude).to(t.dtype))
    return out
