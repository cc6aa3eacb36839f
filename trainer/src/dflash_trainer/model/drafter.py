"""The DFlash draft model (docs/dflash.md, "Drafter architecture").

fc over the K tapped target features + hidden_norm give one context vector c per target position.
L Qwen3-style layers take only the block tokens x as queries; keys/values are [W_k c ; W_k x] and
[W_v c ; W_v x] (k-norm on both, RoPE at absolute positions), so c is injected into every layer
without flowing through the stack. The target's embed_tokens and lm_head are borrowed, frozen.

Parameter names equal the export keys (layers.{i}.self_attn.q_proj.weight, fc.weight, ...), so the
export is state_dict() minus the two frozen borrowed tables.

Legend: B batch, T context (target) positions, Q block query positions (anchors x block size),
H hidden, K taps, nh/nkv query/key-value heads, d head dim.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

FROZEN_PREFIXES = ("embed_tokens.", "lm_head.")


@dataclass
class DrafterConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_layer_ids: list[int]
    num_target_layers: int
    block_size: int
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    split_fc_layers: bool = False
    """Apply fc per tap and sum (DFLASH_SPLIT_FC_LAYERS=1). Identical math; saves the K*H concat."""
    rope_parameters: dict | None = None
    """The drafter's transformers-5 `rope_parameters` when they are anything but plain full-head default RoPE
    (the target's linear/yarn/llama3 scaling; see drafter_rope); None means plain RoPE at rope_theta. Training
    applies exactly these, so the export declares what the weights learned. Checkpoints written before
    drafter_rope may hold a partial_rotary_factor; they still load and run as they were trained."""

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads (GQA)")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"--mask-token-id {self.mask_token_id} is outside the vocabulary {self.vocab_size}")
        if self.block_size < 2:
            raise ValueError("--block-size must be at least 2")

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_target(cls, target_config, num_layers: int, target_layer_ids: list[int], block_size: int,
                    mask_token_id: int, split_fc_layers: bool = False,
                    intermediate_size: int | None = None) -> "DrafterConfig":
        """Layer shapes copied from the target (a HF PretrainedConfig), so the drafter lives in its space; the MLP's
        width is the target's unless `intermediate_size` is given (it touches nothing the target shares)."""
        c = getattr(target_config, "text_config", target_config)
        rope = dict(getattr(c, "rope_parameters", None) or {})
        rope_theta = rope.get("rope_theta", getattr(c, "rope_theta", 1_000_000.0))
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(hidden_size=c.hidden_size, num_hidden_layers=num_layers,
                   num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                   head_dim=head_dim, intermediate_size=intermediate_size or c.intermediate_size,
                   vocab_size=c.vocab_size,
                   target_layer_ids=list(target_layer_ids), num_target_layers=c.num_hidden_layers,
                   block_size=block_size, mask_token_id=mask_token_id, rms_norm_eps=c.rms_norm_eps,
                   rope_theta=float(rope_theta), max_position_embeddings=c.max_position_embeddings,
                   split_fc_layers=split_fc_layers, rope_parameters=drafter_rope(rope))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # the explicit ops, which inductor fuses into the kernels the training step was tuned with
            dtype = x.dtype
            x = x.float()  # the variance in bf16 loses too much; Qwen3 normalizes in fp32 too
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * x.to(dtype)
        # eager (decoding; in training the norms outside the compiled layers): the same math, fp32 inside and rounded
        # to x's dtype before the weight, in one kernel instead of seven (a drafter forward runs 22 norms, and
        # decoding at batch 1 pays per kernel). The .to: CUDA autocast runs rms_norm in fp32 and returns fp32.
        return self.weight * F.rms_norm(x, (x.shape[-1],), eps=self.eps).to(x.dtype)


# The target's rope fields that describe the target's attention, never the drafter's (see drafter_rope).
_TARGET_ONLY_ROPE_KEYS = ("type", "partial_rotary_factor", "rope_dim", "mrope_section", "mrope_interleaved")


def drafter_rope(rope: dict) -> dict | None:
    """The drafter's own rope_parameters, from the target's (docs/dflash.md "RoPE"). The drafter's attention is
    its own (its queries and keys come from its own projections of the block and the context features), so its
    rotary only has to be one that every engine computes from the export as training computed it:
    - the whole head rotates: SGLang's DFlash model rotates head_dim channels whatever partial_rotary_factor
      says (python/sglang/srt/models/dflash.py, DFlashAttention), vLLM rotates what rope_parameters say, so
      only a full-head rotation is one both apply; M-RoPE sections go too (the drafter sees 1-D positions);
    - `dynamic` becomes `default`: SGLang and vLLM each compute a different fixed NTK base for it, transformers
      one that grows with the sequence; below max_position_embeddings transformers' dynamic is default RoPE.
    linear, yarn and llama3 are kept: every engine computes them as transformers does (tests/test_engine_
    conformance.py checks each). None: plain full-head default RoPE (the historical path, so such configs and
    checkpoints stay equal to earlier ones); else the dict with JSON-safe values."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in ("default", "dynamic"):
        return None
    return {k: v for k, v in rope.items() if k not in _TARGET_ONLY_ROPE_KEYS} | {"rope_type": rope_type}


def rope_inv_freq(cfg: DrafterConfig, seq_len: int, device) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim/2], attention scaling) from transformers' own ROPE_INIT_FUNCTIONS, so every rope
    type means what it means in the target; `seq_len` feeds the types that depend on it (dynamic, longrope)."""
    rope = dict(cfg.rope_parameters)
    rope.setdefault("rope_theta", cfg.rope_theta)
    rotary_dim = int(cfg.head_dim * rope.get("partial_rotary_factor", 1.0))
    if rope["rope_type"] == "default":  # transformers keeps this one on each model class; it is one line
        inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
        return inv_freq.to(device), 1.0
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope["rope_type"] not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_type {rope['rope_type']!r} is not one transformers knows "
                         f"({', '.join(sorted(ROPE_INIT_FUNCTIONS))}); fix the target's rope_parameters")
    config = Qwen3Config(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
                         head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings,
                         rope_parameters=rope)
    needs_len = rope["rope_type"] in ("dynamic", "longrope")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, device,
                                                               **({"seq_len": seq_len} if needs_len else {}))
    return inv_freq.to(device=device, dtype=torch.float32), float(scaling)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 cfg: DrafterConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, N] -> cos, sin [B, 1, N, r] (HF layout: the two halves repeat the frequencies); r = d
    unless cfg.rope_parameters rotate only part of each head. cfg None or without rope_parameters: plain RoPE."""
    inv_freq, scaling = _inv_freq(positions, head_dim, theta, cfg)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    if scaling == 1.0:
        return emb.cos()[:, None], emb.sin()[:, None]
    return (emb.cos() * scaling)[:, None], (emb.sin() * scaling)[:, None]  # yarn/longrope's attention factor


LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")  # their frequencies follow the sequence's length
_INV_FREQ: dict[tuple, tuple[torch.Tensor, float]] = {}


def rope_follows_length(cfg: DrafterConfig | None) -> bool:
    return cfg is not None and cfg.rope_parameters is not None and \
        cfg.rope_parameters["rope_type"] in LENGTH_DEPENDENT_ROPE


def _inv_freq(positions: torch.Tensor, head_dim: int, theta: float,
              cfg: DrafterConfig | None) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention scaling) on positions' device, kept per rope and device: decoding asks at every step,
    and a kept table spares four kernels (plain RoPE) or a host computation and its copy to the device (the
    others), which a CUDA graph of the drafter could not hold. Computed anew where the frequencies follow the
    length, and inside torch.compile (the graph computes them itself)."""
    if rope_follows_length(cfg):
        return rope_inv_freq(cfg, int(positions.max()) + 1 if positions.numel() else 1, positions.device)
    plain = cfg is None or cfg.rope_parameters is None

    def fixed() -> tuple[torch.Tensor, float]:
        if not plain:
            return rope_inv_freq(cfg, 1, positions.device)
        exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
        return 1.0 / (theta ** exponents), 1.0

    if torch.compiler.is_compiling():
        return fixed()
    key = ((head_dim, theta) if plain else  # what rope_inv_freq reads of the config
           (json.dumps(cfg.rope_parameters, sort_keys=True), cfg.rope_theta, cfg.head_dim, cfg.hidden_size,
            cfg.num_attention_heads, cfg.max_position_embeddings)) + (str(positions.device),)
    if key not in _INV_FREQ:
        _INV_FREQ[key] = fixed()
    return _INV_FREQ[key]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation of the first cos.shape[-1] channels of each head; the rest pass through
    (partial_rotary_factor < 1, as transformers and the engines apply it)."""
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    # cos and sin are fp32 (.float() is then free), so each product upcasts x inside its kernel: fp32 math, as an
    # explicit x.float() gives, without two copy kernels a call (ten calls a drafter forward, paid one by one when
    # decoding eagerly)
    return (x * cos.float() + rotated * sin.float()).to(x.dtype)


# Flex attention's kernel options by (compute capability, head_dim), measured by benchmarks/attention_kernels.py at
# the seed's shape on an H200: torch's own tiles for head_dim 256 ran the forward at 290 and the backward at 97
# TFLOP/s (a third of the drafter step); 128-query forward tiles with 8 warps reach 436, 8 warps in the backward
# 146 (other tiles: slower, or past the 227 KB of shared memory; TMA in the forward was faster alone, not in the
# whole step). Elsewhere torch's own choice.
FLEX_KERNEL_OPTIONS: dict[tuple[tuple[int, int], int], dict] = {
    ((9, 0), 256): {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_warps": 8, "fwd_num_stages": 2,
                    "bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64,
                    "bwd_num_warps": 8, "bwd_num_stages": 2},
}


def flex_kernel_options(head_dim: int) -> dict | None:
    if not torch.cuda.is_available():
        return None
    return FLEX_KERNEL_OPTIONS.get((torch.cuda.get_device_capability(), head_dim))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, kernel_options: dict | None = None
           ) -> torch.Tensor:
    """mask: a boolean [B, 1, Q, T+Q] tensor (eager SDPA, CPU and tests), a flex BlockMask (CUDA), or None when
    every query sees every key (decoding one block: SDPA may then pick its fastest kernel).
    kernel_options: flex attention's (default: flex_kernel_options for this GPU and head_dim)."""
    if mask is None or isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    if kernel_options is None:
        kernel_options = flex_kernel_options(q.shape[-1])
    if torch.compiler.is_compiling():  # inside a compiled layer: dynamo fuses the raw op itself
        from torch.nn.attention.flex_attention import flex_attention
        return flex_attention(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=kernel_options)
    # imported by name: the export ships a copy of this file for trust_remote_code, and transformers refuses a
    # remote file whose `import` lines name a package (the trainer) that the loading machine may lack
    blocks = importlib.import_module("dflash_trainer.model.blocks")
    return blocks.compiled_flex_attention()(q, k, v, block_mask=mask, enable_gqa=True, kernel_options=kernel_options)


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.nh, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        H = cfg.hidden_size
        self.q_proj = nn.Linear(H, self.nh * self.d, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.d, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.nh * self.d, H, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)

    def forward(self, x_BQH, c_BTH, rope_q, rope_kv, mask) -> torch.Tensor:
        B, Q, _ = x_BQH.shape
        q = self.q_norm(self.q_proj(x_BQH).view(B, Q, self.nh, self.d)).transpose(1, 2)
        kv_in = torch.cat([c_BTH.to(x_BQH.dtype), x_BQH], dim=1)  # context keys first, then the block
        N = kv_in.shape[1]
        k = self.k_norm(self.k_proj(kv_in).view(B, N, self.nkv, self.d)).transpose(1, 2)
        v = self.v_proj(kv_in).view(B, N, self.nkv, self.d).transpose(1, 2)
        q = apply_rope(q, *rope_q)
        k = apply_rope(k, *rope_kv)
        # v is in the compute dtype (bf16 under autocast); the fp32 norm weights promoted q and k.
        out = attend(q.to(v.dtype), k.to(v.dtype), v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, self.nh * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, c, rope_q, rope_kv, mask):
        x = x + self.self_attn(self.input_layernorm(x), c, rope_q, rope_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.fc = nn.Linear(cfg.num_taps * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        # Borrowed from the target and frozen; filled by load_frozen_from_target / the export loader.
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.lm_head = nn.Linear(H, cfg.vocab_size, bias=False)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and name != "lm_head":
                nn.init.normal_(module.weight, std=std)

    def compile_layers(self, **compile_kwargs) -> None:
        """torch.compile each layer in place (CUDA): fuses the fp32 norm/RoPE/cast elementwise work, which
        eager mode runs as separate memory-bound kernels (about a fifth of an eager step at the 27B shape).
        Module.compile keeps parameter names, so checkpoints and exports are unchanged."""
        # Inductor's coalescing analysis failed an assertion (tiling_utils.get_pw_red_splits) when batches
        # of varying length recompiled these layers with dynamic shapes (torch 2.11, H200, the SmolLM2
        # proof); it only picks tilings, so it is switched off.
        import torch._dynamo.config as dynamo_config
        import torch._inductor.config as inductor_config
        inductor_config.triton.coalesce_tiling_analysis = False
        # Mix-order reduction fusion (the norms' backward) is taken only above a size (5 * 2**20 elements of a
        # layer's input), and the choice is a guard: batches on both sides of it compiled twice (proof run 8,
        # `576*B*Q >= 5242880`). Non-strict mode drops that size check, so one graph serves every batch size.
        if hasattr(inductor_config.triton, "mix_order_reduction_non_strict_mode"):
            inductor_config.triton.mix_order_reduction_non_strict_mode = True
        # The layers share one code object, and layer 0's input (the frozen embedding) needs no gradient, so each
        # shape regime holds two graphs: room beyond dynamo's 8, so a late shape never sends the layers to eager.
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 32)
        for layer in self.layers:
            layer.compile(**compile_kwargs)

    def load_frozen(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed_weight)
            self.lm_head.weight.copy_(lm_head_weight)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Exactly the export keys (docs/dflash.md): no embed_tokens, no lm_head."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(FROZEN_PREFIXES)}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor], partial: bool = False) -> None:
        """`partial`: only some trainable tensors (--init-layers-from-target); the others stay as they are."""
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [] if partial else [k for k in missing if not k.startswith(FROZEN_PREFIXES)]
        if missing or unexpected:
            raise ValueError(f"drafter weights do not match the config: missing {missing}, unexpected {unexpected}")

    def context(self, taps: list[torch.Tensor]) -> torch.Tensor:
        return context_vector(self, taps)

    def forward(self, taps: list[torch.Tensor], block_ids_BQ: torch.Tensor, block_pos_BQ: torch.Tensor,
                mask) -> torch.Tensor:
        """Returns the final-normed hidden states of the block slots [B, Q, H]; the head is in loss.py."""
        return draft_hidden(self, self.context(taps), self.embed_tokens(block_ids_BQ), block_pos_BQ, mask)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full logits: for small inputs only (tests, evaluation). Training uses the chunked loss."""
        return self.lm_head(hidden.to(self.lm_head.weight.dtype))


def context_vector(m, taps: list[torch.Tensor]) -> torch.Tensor:
    """K tapped features [B, T, H] each -> c [B, T, H] = hidden_norm(fc(concat taps)). `m` has cfg, fc,
    hidden_norm: the drafter, or the export's transformers model (modeling_dflash.py), which share this code."""
    if m.cfg.split_fc_layers:
        H = m.cfg.hidden_size
        w = m.fc.weight
        c = sum(F.linear(t, w[:, i * H:(i + 1) * H]) for i, t in enumerate(taps))
    else:
        c = m.fc(torch.cat(taps, dim=-1))
    return m.hidden_norm(c)


def draft_hidden(m, c: torch.Tensor, x: torch.Tensor, block_pos_BQ: torch.Tensor, mask) -> torch.Tensor:
    """Context c [B, T, H] and embedded block x [B, Q, H] -> final-normed block hidden states [B, Q, H].
    `m` has cfg, layers, norm (see context_vector)."""
    B, T, _ = c.shape
    ctx_pos = torch.arange(T, device=c.device).expand(B, T)
    # one table for keys and queries, so a length-dependent rope (dynamic) uses one length for both
    rope_kv = rope_cos_sin(torch.cat([ctx_pos, block_pos_BQ], dim=1), m.cfg.head_dim, m.cfg.rope_theta, m.cfg)
    rope_q = tuple(t[:, :, T:] for t in rope_kv)
    for layer in m.layers:
        x = layer(x, c, rope_q, rope_kv, mask)
    return m.norm(x)


def config_to_json(cfg: DrafterConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2)
