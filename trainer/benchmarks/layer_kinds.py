"""Time per kind of decoder layer inside the target's real forward (issue 31), and the ways of compiling each kind
that target_forward.py compares. The compiling itself is FrozenTarget.compile_layers with a table of kind -> how
(model/target.py's COMPILE_BY_KIND is the kept one); this file only times and undoes it.

Each decoder layer is wrapped in a TimedLayer (dflash-train --plan's, advisor/layer_timing.py), which records a
CUDA event before and after the layer (after the layer was compiled: the events stay outside the graph), so the
seconds of each kind come from the same forwards that the
whole-forward time does. The FLOP of a layer: 2 x its parameters x tokens, plus, for full attention, the causal
attention (4 x heads x head_dim x B x T(T+1)/2); a Gated DeltaNet layer's own recurrence is not counted.
"""

from __future__ import annotations

import contextlib
import sys

from dflash_trainer.advisor.layer_timing import (TimedLayers, decoder_layers,  # noqa: F401 (target_forward.py's)
                                                events_ms, fit_to_forward)
from dflash_trainer.model import target as target_module
from dflash_trainer.model.fused_projections import unfuse_layer
from dflash_trainer.model.target import (AROUND_KERNELS, AROUND_KERNELS_SHIFTS, COMPILED, COMPILE_BY_KIND, EAGER,
                                         layer_kinds)

# Strategies compared by --target-layers kinds: kind -> how ("default": layers of families without layer_types).
STRATEGIES = {
    "eager": {"default": EAGER},
    "linear-eager": {"default": COMPILED, "full_attention": COMPILED, "linear_attention": EAGER},
    "all-compiled": {"default": COMPILED},  # fla's kernel traced by the compiler too
    "around-fla": {"default": COMPILED, "full_attention": COMPILED, "linear_attention": AROUND_KERNELS},
    "around-fla-shifts": {"default": COMPILED, "full_attention": COMPILED, "linear_attention": AROUND_KERNELS_SHIFTS},
    "by-kind": COMPILE_BY_KIND,  # what dflash-train runs (the shifts, with projections fused)
    # the same as it ran until 2026-12-05: fla's kernel made its inputs contiguous itself (model/target.py's
    # opaque_kernel), outside the graph
    "by-kind-kernel-copies": COMPILE_BY_KIND,
}
KERNEL_COPIES = {"by-kind-kernel-copies"}


@contextlib.contextmanager
def kernel_copies(on: bool):
    """While on, make_kernels_opaque leaves the kernel's inputs as the graph hands them over (the reference for
    opaque_kernel's contiguous inputs, measured in the same process)."""
    import torch
    if not on:
        yield
        return
    made = target_module.opaque_kernel
    target_module.opaque_kernel = lambda fn: torch.compiler.disable(fn, recursive=True)
    try:
        yield
    finally:
        target_module.opaque_kernel = made


def uncompile(target) -> None:
    """Back to eager: the layers' compiled calls dropped, fused projections undone, dynamo's caches cleared, the
    kernel made opaque by make_kernels_opaque put back."""
    import torch
    for layer in decoder_layers(target):
        layer._compiled_call_impl = None
        unfuse_layer(layer)
        attn = getattr(layer, "linear_attn", None)
        module = sys.modules.get(type(attn).__module__) if attn is not None else None
        for name in ("torch_chunk_gated_delta_rule", "causal_conv1d_fn"):
            fn = getattr(module, name, None)
            if hasattr(fn, "_dflash_original"):
                setattr(module, name, fn._dflash_original)
    torch._dynamo.reset()


def kind_params(target) -> dict:
    """{kind: parameters of one layer of that kind} (the layers of a kind have one shape)."""
    layers = decoder_layers(target)
    out = {}
    for layer, kind in zip(layers, layer_kinds(target.config, len(layers))):
        out.setdefault(kind, sum(p.numel() for p in layer.parameters()))
    return out


def layer_flop(shape: dict, kind: str, params: int) -> float:
    """FLOP of one layer of `kind` for one forward of shape["batch"] sequences of shape["seq_len"] tokens."""
    B, T = shape["batch"], shape["seq_len"]
    flop = 2 * params * B * T
    if kind != "linear_attention":
        flop += 4 * shape["heads"] * shape["head_dim"] * B * T * (T + 1) / 2
    return flop
