"""Which code runs the target's linear-attention layers, and the refusal of the slow one on a GPU (issue 31).

The seed's family (Qwen3.5/3.6: 48 Gated DeltaNet + 16 full-attention layers at 27B) runs each DeltaNet layer's
chunked gated delta rule through flash-linear-attention (`fla`, Triton kernels) when transformers can import it,
else through transformers' own torch reference; and its short depthwise causal conv through `causal_conv1d` when
that imports, else as `F.conv1d` (transformers' reference). On one H200 at the 27B shape (8,192 tokens) a DeltaNet
layer took 11.5 ms with fla as dflash-train compiles it and 26.7 ms with the fallback (2026-12-03; eager: 15.2 vs
26.5), the 64-layer forward 0.733 vs 1.432 s per sequence, so the fallback is refused on a GPU unless the operator
opts in (DFLASH_SLOW_LINEAR_ATTENTION=1). The fast kernels are the trainer's `fla` extra
(trainer/pyproject.toml; roles/trainer installs it). causal-conv1d has no wheel on PyPI (a source build against
one CUDA toolkit), so the conv runs as transformers' F.conv1d reference, which compiled DeltaNet layers replace by
shifted sums the compiler fuses (model/target.py, shifted_causal_conv): CONV_FALLBACK_NOTE says what that costs.

This mirrors transformers' own choice (integrations/hub_kernels.use_kernel_func_from_hub_with_fallback: import the
package, then its ops module) without loading a model, so dflash-train --check can say it too.
"""

from __future__ import annotations

import importlib
import importlib.metadata

from dflash_trainer.config import StartupError

FLA_EXTRA = "fla"
LINEAR_ATTENTION = "linear_attention"
# What the module transformers resolves each kernel from imports, and the function it takes (transformers 5.x).
KERNELS = {"fla": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule", "flash-linear-attention"),
           "causal_conv1d": ("causal_conv1d", "causal_conv1d_fn", "causal-conv1d")}
# The conv's cost without causal-conv1d, measured (benchmarks/target_forward.py --preset qwen3.6-27b, issue 31).
CONV_FALLBACK_NOTE = ("no causal-conv1d wheel on PyPI; a compiled DeltaNet layer took 12.9 ms on an H200 with "
                      "F.conv1d, 11.5 ms with the conv as shifted sums the compiler fuses, which dflash-train uses")


def layer_types(config) -> list[str]:
    """The text model's layer kinds (config object or config.json dict); [] for families without the field."""
    if isinstance(config, dict):
        text = config.get("text_config") or config
        return list(text.get("layer_types") or [])
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return list(getattr(text, "layer_types", None) or [])


def found_kernels() -> dict:
    """{"fla": version or None, "causal_conv1d": version or None}: what transformers would run, by importing it."""
    found = {}
    for key, (module, func, dist) in KERNELS.items():
        try:
            ok = getattr(importlib.import_module(module), func, None) is not None
        except Exception:  # a missing package, or one that fails to import (no triton on a CPU-only torch)
            ok = False
        found[key] = _version(dist) if ok else None
    return found


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def describe(found: dict, num_linear: int) -> str:
    """The `target kernels:` line: which linear-attention and conv code runs."""
    if not num_linear:
        return "no linear-attention layers (nothing to choose)"
    attn = (f"flash-linear-attention {found['fla']} (chunked Triton kernels)" if found["fla"] else
            "transformers' torch fallback (SLOW: 26.7 vs 11.5 ms per layer on an H200; the trainer's fla extra has "
            "the kernels)")
    conv = (f"causal-conv1d {found['causal_conv1d']}" if found["causal_conv1d"] else
            f"torch ({CONV_FALLBACK_NOTE})")
    return f"{num_linear} linear-attention layers: gated delta rule by {attn}; causal conv by {conv}"


def refusal(found: dict, num_linear: int, on_gpu: bool, allow_slow: bool) -> str | None:
    """The one-line refusal of the torch fallback on a GPU, or None."""
    if not num_linear or not on_gpu or found["fla"] or allow_slow:
        return None
    return (f"the target's {num_linear} linear-attention layers would run transformers' torch fallback on the GPU "
            f"(flash-linear-attention does not import here; 2.3x slower per layer on an H200): install the trainer's "
            f"'{FLA_EXTRA}' extra (pip install 'dflash_trainer[{FLA_EXTRA}]'; roles/trainer: dflash_trainer_extras "
            f"with {FLA_EXTRA}), or set DFLASH_SLOW_LINEAR_ATTENTION=1 to train with the fallback")


def check(config, on_gpu: bool, allow_slow: bool, found: dict | None = None) -> str:
    """The `target kernels:` line for this target on this device; StartupError when the fallback is refused."""
    found = found_kernels() if found is None else found
    num_linear = layer_types(config).count(LINEAR_ATTENTION)
    problem = refusal(found, num_linear, on_gpu, allow_slow)
    if problem:
        raise StartupError(problem)
    line = describe(found, num_linear)
    if num_linear and not found["fla"] and on_gpu:
        line += " (DFLASH_SLOW_LINEAR_ATTENTION=1)"
    return line
