"""The frozen target: a HF causal LM from a local directory, returning its tapped hidden states.

Feature of tapped layer id i = the output of decoder layer i = HF `hidden_states[i + 1]` (docs/dflash.md).
For soft labels it also returns the final-normed last hidden state (`last_hidden_state`); the loss
applies lm_head to it chunk by chunk, so full-vocabulary logits never exist for a whole batch.
With `split_over` (several devices, the first = `device`) the layers are spread over them (target_split.py);
the taps and last hidden state come back on `device` either way.
"""

from __future__ import annotations

import torch

from dflash_trainer.model.fused_projections import fuse_layer

EAGER, COMPILED, AROUND_KERNELS = "eager", "compiled", "compiled around the fla kernel"
AROUND_KERNELS_SHIFTS = "compiled around the fla kernel, conv as shifted sums"
FUSED = ", projections fused"  # fused_projections.py: one GEMM per group of projections of the same input
COMPILED_FUSED, AROUND_KERNELS_SHIFTS_FUSED = COMPILED + FUSED, AROUND_KERNELS_SHIFTS + FUSED
# How each kind of decoder layer runs on one GPU, kept from measurements on one H200 at the real shapes (8,192
# tokens; benchmarks/target_forward.py --preset qwen3.6-27b --target-layers kinds; trainer/results/
# target-forward-qwen3.6-27b-h200-2026-12-03-*). Qwen3/Llama layers ("default") and full attention: compiled (13.0 ->
# 10.2 ms per 27B-shaped layer). Gated DeltaNet with fla: eager 15.2 ms; compiled with fla's kernel traced 23.6 ms;
# compiled around fla's kernel 12.8 ms; the same with the conv as shifted sums 11.5 ms (AROUND_KERNELS_SHIFTS).
# Projections fused (a 3 + 1-layer target, the layers timed inside its forward, 2026-12-03): Gated DeltaNet 10.91 ->
# 10.58 ms, full attention 10.53 -> 10.42 ms; Qwen3/Llama layers not measured fused, so left as they were.
COMPILE_BY_KIND = {"default": COMPILED, "full_attention": COMPILED_FUSED,
                   "linear_attention": AROUND_KERNELS_SHIFTS_FUSED}


def layer_kinds(config, num_layers: int) -> list[str]:
    """Each decoder layer's kind: the text config's layer_types (Qwen3.5/3.6: linear_attention, full_attention),
    "default" for families without them."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = list(getattr(text, "layer_types", None) or [])
    has_linear = "linear_attention" in types
    return [types[i] if has_linear and i < len(types) else "default" for i in range(num_layers)]


def shifted_causal_conv(hidden_states, weight, bias=None, activation=None, **_kwargs):
    """transformers' causal_conv1d_fn (the Gated DeltaNet's depthwise causal conv, kernel 4, then SiLU) as a sum of
    shifted inputs times the taps' weights: elementwise, so the compiler fuses it with the activation and the casts
    into one kernel, where F.conv1d is a separate depthwise convolution (causal-conv1d has no wheel on PyPI).
    hidden_states (B, C, T), weight (C, K)."""
    import torch.nn.functional as F
    from transformers.activations import ACT2FN
    K, T = weight.shape[-1], hidden_states.shape[-1]
    x = F.pad(hidden_states.to(weight.dtype), (K - 1, 0))
    out = x[..., 0:T] * weight[:, 0:1]
    for k in range(1, K):
        out = out + x[..., k:k + T] * weight[:, k:k + 1]
    if bias is not None:
        out = out + bias[:, None]
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(hidden_states.dtype)


def opaque_kernel(fn):
    """`fn` left out of the compiled graph, its tensor inputs made contiguous inside the graph first. The kernel makes
    them contiguous itself (fla's input_guard), but there each copy is a separate eager kernel: the layer's value
    heads reach it in the conv's channel-major layout, so that copy is a transpose of the whole value tensor. Called
    inside the graph, the compiler writes the producing kernels' outputs in the contiguous layout instead."""
    import torch
    kernel = torch.compiler.disable(fn, recursive=True)

    def contiguous(x):
        return x.contiguous() if isinstance(x, torch.Tensor) else x

    def call(*args, **kwargs):
        return kernel(*map(contiguous, args), **{name: contiguous(x) for name, x in kwargs.items()})
    return call


def make_kernels_opaque(layer, conv_shifts: bool = False) -> bool:
    """Leave the layer's gated-delta-rule kernel out of the compiled graph (a graph break around it): transformers
    calls it through a module global of the layer's modeling file, which resolves to fla's Triton kernel when fla
    imports. Compiling the rest (projections, conv, gates, norms, MLP) keeps the fusion; tracing fla's kernel is what
    made the compiled layer slow. False (nothing changed) when the layer has no such kernel or fla does not import."""
    import functools
    import sys
    import torch
    attn = getattr(layer, "linear_attn", None)
    module = sys.modules.get(type(attn).__module__) if attn is not None else None
    fn = getattr(module, "torch_chunk_gated_delta_rule", None)
    if fn is None:
        return False
    if getattr(fn, "_dflash_opaque", False):  # another layer of the model did it
        return True
    from dflash_trainer.model.target_kernels import found_kernels
    if not found_kernels()["fla"]:
        return False
    opaque = opaque_kernel(fn)
    opaque._dflash_opaque, opaque._dflash_original = True, fn
    setattr(module, "torch_chunk_gated_delta_rule", opaque)
    conv = getattr(module, "causal_conv1d_fn", None)
    if conv_shifts and conv is not None and not found_kernels()["causal_conv1d"]:
        shifts = functools.wraps(conv)(shifted_causal_conv)
        shifts._dflash_original = conv
        setattr(module, "causal_conv1d_fn", shifts)
    return True


def compile_decoder_layers(layers, config, by_kind: dict | None = None, recompile_limit: int = 32,
                           **compile_kwargs) -> str:
    """torch.compile each decoder layer in place as COMPILE_BY_KIND (or `by_kind`) says for its kind; returns what
    was done, for the log. Training (FrozenTarget) runs the layers without a KV cache, so the layers of a kind share
    one graph per shape regime. Decoding with a cache (serve_bench) specializes each layer's graphs on its layer
    index (the cache's layer it updates), the cache's kind and prefill or decode: about four a layer (SmolLM2's 30
    layers: 123 in one frame), so `recompile_limit` must be several times the layer count or the later layers fall
    back to eager. Compiling the whole forward instead breaks the graph at transformers' output
    capturing (a lock) and recompiles as the cache fills (PROOF.md run 26)."""
    import torch._dynamo.config as dynamo_config
    by_kind = COMPILE_BY_KIND if by_kind is None else by_kind
    kinds = layer_kinds(config, len(layers))
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, recompile_limit)
    done = {}
    for layer, kind in zip(layers, kinds):
        how = by_kind.get(kind, by_kind.get("default", EAGER))
        around = how.removesuffix(FUSED)
        if around in (AROUND_KERNELS, AROUND_KERNELS_SHIFTS) and not make_kernels_opaque(
                layer, conv_shifts=around == AROUND_KERNELS_SHIFTS):
            how = f"{EAGER} (no fla: the compiler would unroll the torch fallback's chunk loop)"
        if how.endswith(FUSED):
            fuse_layer(layer)
        if not how.startswith(EAGER):
            layer.compile(**compile_kwargs)
        done[kind] = (how, done.get(kind, (how, 0))[1] + 1)
    parts = ", ".join(f"{n} {kind} layers {how}" for kind, (how, n) in done.items())
    compiled = any(not how.startswith(EAGER) for how, _ in done.values())
    return f"{'compiled' if compiled else 'eager'} ({parts})"


class FrozenTarget:
    def __init__(self, model_dir: str | None, device: torch.device, layer_ids: list[int], need_last_hidden: bool,
                 split_over: list[torch.device] | None = None, model=None):
        """`model`: an already built causal LM instead of loading `model_dir` (dflash-train --plan's random layers
        of the real target's shape)."""
        from transformers import AutoModelForCausalLM

        # bf16 on GPU (the serving dtype); fp32 on CPU, where bf16 matmuls are slow and tests want exactness.
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        self.model = model.eval()
        self.layer_devices = None
        if split_over and len(split_over) > 1:
            from dflash_trainer.model.target_split import place_layers
            self.layer_devices = place_layers(self.model, split_over)
        else:
            self.model.to(device)
        self.model.requires_grad_(False)
        self.config = self.model.config
        self.device = device
        self.layer_ids = list(layer_ids)
        self.need_last_hidden = need_last_hidden
        num_layers = getattr(self.config, "text_config", self.config).num_hidden_layers
        if max(self.layer_ids) >= num_layers - 1:
            # hidden_states[num_layers] is the final-normed output in transformers 5, not layer output.
            raise ValueError(f"--target-layer-ids {self.layer_ids} must be below {num_layers - 1}")

    def compile_layers(self, by_kind: dict | None = None) -> str:
        """torch.compile the decoder layers in place (CUDA, the target on one device), each as COMPILE_BY_KIND
        (or `by_kind`) says for its kind: fuses the norms, RoPE, SwiGLU and casts that eager transformers runs as
        separate memory-bound kernels (the Qwen3-8B forward: 0.61 -> 0.78 of the bf16 peak on an H200;
        benchmarks/target_forward.py). The layers of a kind share one graph per shape regime. Returns what was
        done, for the log."""
        layers = getattr(getattr(self.model, "model", None), "layers", None)
        if self.device.type != "cuda":
            return "eager (not on CUDA)"
        if self.layer_devices is not None:
            return "eager (split over GPUs)"
        if layers is None:
            return f"eager ({type(self.model).__name__}: not compiled until measured on a GPU)"
        return compile_decoder_layers(layers, self.config, by_kind)

    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    @torch.no_grad()
    def __call__(self, input_ids_BT: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        # Right padding under a causal mask never changes the states of real positions, so no
        # attention_mask is passed (it would force the slower masked attention path).
        out = self.model.model(input_ids=input_ids_BT.to(self.device), output_hidden_states=True, use_cache=False)
        taps = [out.hidden_states[i + 1].to(self.device) for i in self.layer_ids]
        last = out.last_hidden_state.to(self.device) if self.need_last_hidden else None
        return taps, last
