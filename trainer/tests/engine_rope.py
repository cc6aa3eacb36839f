"""The rotation SGLang and vLLM apply in a DFlash draft's attention, computed from an export's config.json as
each engine computes it: the rotary width its DFlash attention asks for, then the cos/sin table of the rope
type its get_rope builds. Written from the engines' released sources (the wheels are too large to run here);
every rule cites the file and line it was read from, at the versions test_engine_conformance.py names.

The config reaches each engine through transformers (AutoConfig of the export, model_type qwen3), as here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SG_DFLASH, SG_ROPE = "python/sglang/srt/models/dflash.py", "python/sglang/srt/layers/rotary_embedding/"
VL_DFLASH, VL_ROPE = "vllm/model_executor/models/qwen3_dflash.py", "vllm/model_executor/layers/rotary_embedding/"


@dataclass
class Rotation:
    rotary_dim: int
    cos: torch.Tensor  # [N, rotary_dim], HF layout (the two halves repeat the frequencies)
    sin: torch.Tensor


def _sglang_width(hf, head_dim: int) -> tuple[int, dict]:
    """dflash.py:252-275 (DFlashAttention.__init__): get_rope(head_dim, rotary_dim=head_dim, ...,
    partial_rotary_factor=getattr(config, "partial_rotary_factor", 1.0)); an explicit rope_parameters.rope_dim
    wins and drops partial/M-RoPE keys; rotary_embedding/factory.py:156 applies the factor."""
    rope = dict(hf.rope_parameters or {})
    if "rope_dim" in rope:
        return int(rope["rope_dim"]), rope
    factor = float(getattr(hf, "partial_rotary_factor", 1.0) or 1.0)
    return int(head_dim * factor) if factor < 1.0 else head_dim, rope


def _vllm_width(hf, head_dim: int) -> tuple[int, dict]:
    """qwen3_dflash.py:222,348: get_rope(head_dim, rope_parameters=config.rope_parameters);
    rotary_embedding/__init__.py:66-72: rope_parameters.rope_dim, else head_dim * rope_parameters'
    partial_rotary_factor."""
    rope = dict(hf.rope_parameters or {})
    return int(rope.get("rope_dim") or head_dim * rope.get("partial_rotary_factor", 1.0)), rope


def _sglang_dynamic_base(base, f, rd, max_pos, rope):
    """rotary_embedding/rope_variant.py:880-886: the NTK base at max_len = max_position * factor."""
    max_len = max_pos * f
    return base * ((f * max_len / max_pos) - (f - 1)) ** (rd / (rd - 2))


def _vllm_dynamic_base(base, f, rd, max_pos, rope):
    """rotary_embedding/__init__.py:224-238 and dynamic_ntk_scaling_rope.py:53-65."""
    trained = rope.get("max_trained_positions", max_pos)
    return base * ((f * max_pos / trained) - (f - 1)) ** (rd / (rd - 2))


def _yarn_correction(rope, rd, base, orig):
    """yarn_find_correction_range (SGLang yarn.py:27, vLLM common.py:46): beta_fast 32, beta_slow 1."""
    def dim(rot):
        return rd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = dim(rope.get("beta_fast", 32)), dim(rope.get("beta_slow", 1))
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rd - 1)


def _yarn_mscale(engine: str, rope: dict) -> float:
    """SGLang yarn.py:122-131 (mscale/mscale_all_dim ratio, else 0.1 ln f + 1, times attn_factor);
    vLLM yarn_scaling_rope.py (attention_factor, else the ratio, else 0.1 ln f + 1)."""
    f = rope["factor"]

    def m(scale):
        return 1.0 if f <= 1 else 0.1 * scale * math.log(f) + 1.0
    if engine == "vllm" and rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    ratio = m(rope["mscale"]) / m(rope["mscale_all_dim"]) if rope.get("mscale") and rope.get("mscale_all_dim") \
        else m(1.0)
    return ratio * (rope.get("attn_factor", 1.0) if engine == "sglang" else 1.0)


def _inv_freq(rd: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float) / rd))


def _frequencies(engine: str, rope: dict, rd: int, max_pos: int) -> tuple[torch.Tensor, float, float]:
    """(inv_freq, position divisor, cos/sin scale) of get_rope's rope type (SGLang factory.py:201-340, vLLM
    __init__.py:112-290)."""
    kind, base = rope.get("rope_type", rope.get("type", "default")), rope["rope_theta"]
    if kind == "default":
        return _inv_freq(rd, base), 1.0, 1.0
    if kind == "linear":  # SGLang base.py:649, vLLM linear_scaling_rope.py: t / factor
        return _inv_freq(rd, base), float(rope["factor"]), 1.0
    if kind == "dynamic":
        dyn = _sglang_dynamic_base if engine == "sglang" else _vllm_dynamic_base
        return _inv_freq(rd, dyn(base, rope["factor"], rd, max_pos, rope)), 1.0, 1.0
    if kind == "llama3":  # SGLang rope_variant.py:579-599, vLLM llama3_rope.py
        inv = _inv_freq(rd, base)
        f, lo, hi = rope["factor"], rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
        orig = rope.get("original_max_position_embeddings", max_pos)
        wave = 2 * math.pi / inv
        smooth = (orig / wave - lo) / (hi - lo) if lo != hi else 0
        scaled = torch.where(wave > orig / lo, inv / f, (1 - smooth) * inv / f + smooth * inv)
        return torch.where(wave < orig / hi, inv, scaled), 1.0, 1.0
    if kind == "yarn":  # SGLang yarn.py:137-161, vLLM yarn_scaling_rope.py
        orig = rope.get("original_max_position_embeddings", max_pos)
        pos_freqs = base ** (torch.arange(0, rd, 2, dtype=torch.float) / rd)
        low, high = _yarn_correction(rope, rd, base, orig)
        high = high + 0.001 if low == high else high
        ramp = torch.clamp((torch.arange(rd // 2, dtype=torch.float) - low) / (high - low), 0, 1)
        keep = (1 - ramp) * (rope.get("extrapolation_factor", 1.0) if engine == "sglang" else 1.0)
        inv = (1.0 / (rope["factor"] * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
        return inv, 1.0, _yarn_mscale(engine, rope)
    raise ValueError(f"{engine}: rope_type {kind!r} is not one these rows model")


def engine_rotation(engine: str, export_dir: str, positions: torch.Tensor) -> Rotation:
    """What `engine` ("sglang" or "vllm") rotates each draft head by at `positions` [N], from the export."""
    from transformers import AutoConfig
    hf = AutoConfig.from_pretrained(export_dir)
    head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    rd, rope = (_sglang_width if engine == "sglang" else _vllm_width)(hf, head_dim)
    inv, divisor, scale = _frequencies(engine, rope, rd, int(hf.max_position_embeddings))
    freqs = (positions.float() / divisor)[:, None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return Rotation(rd, emb.cos() * scale, emb.sin() * scale)
