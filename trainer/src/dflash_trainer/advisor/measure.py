"""The advisor's measurements on one device, through dflash-train's own code: the target's layers as FrozenTarget
runs them (COMPILE_BY_KIND, the kernels of target_kernels.py) and one drafter micro-batch and optimizer step as the
loop runs them (training_drafter, step.drafter_micro_batch, drafter_adamw).

The target: random weights in the shape of the real target's config.json (no weights are read), its first layers
up to one of each kind (Qwen3.5/3.6: 3 Gated DeltaNet + 1 full attention; at least MIN_LAYERS), one sequence of
--max-seq-len tokens; seconds per sequence of the whole target = each kind's measured ms x its count in the real
model + the rest of the forward (embedding, final norm); the kinds' ms fitted to the untimed forward where their
events sum to more (layer_timing.fit_to_forward). The drafter: one micro-batch of the run's shape (the
sequences --token-budget holds at --max-seq-len, at most --max-batch-size) on random hidden states, forward and
backward, plus an optimizer step shared by --grad-accum micro-batches.

Both stages are predicted at the pace of a device kept busy, as the run keeps it (busy_timing): the forwards and
the micro-batches are also run back to back for busy_timing.SUSTAIN_S, and the target's kinds are scaled by that
pace against its forward timed alone (layer_timing.at_busy_pace); both figures are kept in plan.json.
"""

from __future__ import annotations

import torch

from dflash_trainer.advisor.busy_timing import alone_s, back_to_back_s, busy_calls
from dflash_trainer.advisor.layer_timing import TimedLayers, at_busy_pace, fit_to_forward
from dflash_trainer.model.target import layer_kinds

MIN_LAYERS = 2
WARMUP, CALLS = 2, 3


def measure_layers(text_config) -> int:
    """How many leading layers hold one of each of the model's kinds."""
    kinds = layer_kinds(text_config, text_config.num_hidden_layers)
    want, seen = set(kinds), set()
    for i, kind in enumerate(kinds):
        seen.add(kind)
        if seen == want:
            return max(MIN_LAYERS, i + 1)
    return max(MIN_LAYERS, len(kinds))


def random_target(cfg, device):
    """(FrozenTarget of the first measure_layers layers, random, the real text config)."""
    import copy
    from transformers import AutoConfig, AutoModelForCausalLM
    from dflash_trainer.model.target import FrozenTarget
    real = AutoConfig.from_pretrained(cfg.target_model).get_text_config()
    small = copy.deepcopy(real)
    n = measure_layers(real)
    small.num_hidden_layers = n
    if getattr(small, "layer_types", None):
        small.layer_types = list(real.layer_types[:n])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(small, dtype=dtype)
    return FrozenTarget(None, device, [0], need_last_hidden=cfg.use_soft_labels, model=model), real


def target_seconds(cfg, device, log) -> tuple[dict, object]:
    """({"s_per_seq", "per_kind", "layers", "measured_layers"}, the FrozenTarget) for one --max-seq-len sequence."""
    target, real = random_target(cfg, device)
    how = target.compile_layers() if cfg.compile_target else "eager (DFLASH_EAGER_TARGET=1)"
    log(f"plan: target: {target.model.config.num_hidden_layers} random layers of {type(target.model).__name__}'s "
        f"shape, {how}")
    ids = torch.randint(0, real.vocab_size - 1, (1, cfg.max_seq_len), generator=torch.Generator().manual_seed(0))
    for _ in range(WARMUP):
        target(ids)
    forward_ms = alone_s(lambda _i: target(ids), CALLS, device) * 1e3
    real_kinds = layer_kinds(real, real.num_hidden_layers)
    if device.type == "cuda":
        with TimedLayers(target) as timed:
            for _ in range(CALLS):
                timed.call(lambda: target(ids))
        per_kind = timed.per_kind()
    else:  # no events: the forward split evenly over its layers
        n = target.model.config.num_hidden_layers
        small = layer_kinds(target.model.config, n)
        per_kind = {k: {"layers": small.count(k), "ms_per_layer": forward_ms / n} for k in dict.fromkeys(small)}
    per_kind, rest_ms, _ = fit_to_forward(per_kind, forward_ms)
    busy_ms = back_to_back_s(lambda _i: target(ids), busy_calls(forward_ms / 1e3, CALLS), device) * 1e3
    per_kind, rest_ms = at_busy_pace(per_kind, rest_ms, busy_ms / forward_ms)
    total_ms = rest_ms + sum(real_kinds.count(kind) * k["ms_per_layer"] for kind, k in per_kind.items())
    return {"s_per_seq": total_ms / 1e3, "per_kind": per_kind, "rest_ms": rest_ms, "layers": len(real_kinds),
            "layers_per_kind": {k: real_kinds.count(k) for k in per_kind}, "compiled": how,
            "forward_ms_alone": forward_ms, "forward_ms_busy": busy_ms}, target


def drafter_seconds(cfg, drafter_cfg, num_taps: int, target, device, log) -> dict:
    """{"s_per_seq", "micro_batch_s", "optimizer_s", "sequences_per_micro_batch"} at the run's shape."""
    from dflash_trainer.loop.optimizer import drafter_adamw
    from dflash_trainer.loop.step import drafter_micro_batch
    from dflash_trainer.loop.train import training_drafter
    drafter, linears = training_drafter(drafter_cfg, target, device, cfg.compile_layers, cfg.fp8_layers)
    log(f"plan: drafter: {cfg.num_draft_layers} layers, hidden {drafter_cfg.hidden_size}; linears {linears}")
    optimizer = drafter_adamw([p for p in drafter.parameters() if p.requires_grad], cfg.lr, cfg.weight_decay, device)
    B, T, H = max(1, min(cfg.token_budget // cfg.max_seq_len, cfg.max_batch_size)), cfg.max_seq_len, \
        drafter_cfg.hidden_size
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    taps = [torch.randn(B, T, H, device=device, dtype=dtype, generator=g) for _ in range(num_taps)]
    last = torch.randn(B, T, H, device=device, dtype=dtype, generator=g) if cfg.use_soft_labels else None
    ids = torch.randint(0, drafter_cfg.vocab_size - 1, (B, T), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, :16] = False
    lengths = torch.full((B,), T)

    def micro_batch(i):
        out = drafter_micro_batch(drafter, taps, last, ids, mask, lengths, max_anchors=cfg.max_anchors,
                                  gamma=cfg.gamma, noise_amplitude=0.0, seed=i, head_chunk_size=cfg.head_chunk_size,
                                  soft_label_temperature=cfg.soft_label_temperature)
        out.loss.backward()

    for i in range(WARMUP):  # compilation, the allocator
        micro_batch(i)
    mb_alone_s = alone_s(micro_batch, CALLS, device)
    mb_s = back_to_back_s(micro_batch, busy_calls(mb_alone_s, CALLS), device)  # the pace the loop keeps
    opt_s = alone_s(lambda _i: optimizer.step(), CALLS, device)  # on the accumulated gradients
    optimizer.zero_grad(set_to_none=True)
    return {"s_per_seq": (mb_s + opt_s / cfg.grad_accum) / B, "micro_batch_s": mb_s,
            "micro_batch_s_alone": mb_alone_s, "optimizer_s": opt_s, "sequences_per_micro_batch": B}
