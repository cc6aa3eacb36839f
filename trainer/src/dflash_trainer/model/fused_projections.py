"""One matrix product where a frozen decoder layer runs several on the same input (issue 31).

A Qwen3.5/3.6 layer multiplies its normed input by gate_proj and up_proj (the MLP) and, in a Gated DeltaNet layer,
by in_proj_qkv, in_proj_z, in_proj_b and in_proj_a: separate GEMMs that each read the whole input, two of them 48
columns wide. Fused, each group is one GEMM over the weights laid end to end. Measured on one H200 at the 27B shape
(8,192 tokens, the layers compiled as dflash-train compiles them): a Gated DeltaNet layer 10.91 -> 10.58 ms, a
full-attention layer (its MLP only) 10.53 -> 10.42 ms.

The concatenated weight is the storage: each original Linear's weight becomes a view into it, so nothing is held
twice and `unfuse_layer` gives back the layer as transformers wrote it (benchmarks compare both in one process).
Only the target's no-cache prefill is fused, the one call FrozenTarget makes; any other call runs transformers' own
forward.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F

DELTANET_INPUTS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
# What transformers' model forward hands every layer that leaves a no-cache prefill as it is (FrozenTarget's call
# brings use_cache and output_hidden_states); any other keyword (packed sequences' cu_seq_lens_q, ...) runs
# transformers' own forward.
PREFILL_KWARGS = frozenset({"use_cache", "output_hidden_states", "output_attentions"})
MLP_INPUTS = ("gate_proj", "up_proj")


def _concatenate(module, names: tuple[str, ...], buffer: str) -> list[int]:
    """The named Linears' weights laid end to end in one buffer, each weight now a view into it; their widths."""
    linears = [getattr(module, n) for n in names]
    weight = torch.cat([lin.weight.detach() for lin in linears])
    widths, start = [], 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(weight[start:start + n], requires_grad=False)
        widths.append(n)
        start += n
    module.register_buffer(buffer, weight, persistent=False)
    return widths


def fuse_mlp(mlp) -> bool:
    """gate_proj and up_proj as one GEMM (SwiGLU MLPs without bias); False where the module is not one."""
    if getattr(mlp, "_dflash_fused", False):
        return True
    if not all(isinstance(getattr(mlp, n, None), torch.nn.Linear) and getattr(mlp, n).bias is None
               for n in MLP_INPUTS + ("down_proj",)):
        return False
    _concatenate(mlp, MLP_INPUTS, "gate_up_weight")

    def forward(self, x):
        gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)
    mlp.forward, mlp._dflash_fused = types.MethodType(forward, mlp), True
    return True


def fuse_gated_deltanet(attn) -> bool:
    """The four input projections of transformers' Gated DeltaNet as one GEMM, in its no-cache prefill."""
    if getattr(attn, "_dflash_fused", False):
        return True
    if not all(isinstance(getattr(attn, n, None), torch.nn.Linear) for n in DELTANET_INPUTS):
        return False
    widths = _concatenate(attn, DELTANET_INPUTS, "in_proj_weight")
    layer_forward = type(attn).forward
    modeling = sys.modules[type(attn).__module__]  # its kernels are looked up per call (make_kernels_opaque's too)

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        if cache is not None or attention_mask is not None or not PREFILL_KWARGS.issuperset(kwargs):
            return layer_forward(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
        B, T, _ = hidden_states.shape
        mixed_qkv, z, b, a = torch.split(F.linear(hidden_states, self.in_proj_weight), widths, dim=-1)
        mixed_qkv = modeling.causal_conv1d_fn(mixed_qkv.transpose(1, 2), self.conv1d.weight.squeeze(1),
                                              self.conv1d.bias, activation=self.activation).transpose(1, 2)
        query, key, value = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        query = query.reshape(B, T, -1, self.head_k_dim)
        key = key.reshape(B, T, -1, self.head_k_dim)
        value = value.reshape(B, T, -1, self.head_v_dim)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        out, _ = modeling.torch_chunk_gated_delta_rule(query, key, value, g=g, beta=b.sigmoid(), initial_state=None,
                                                       output_final_state=False, use_qk_l2norm_in_kernel=True)
        out = self.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
        return self.out_proj(out.reshape(B, T, -1))
    attn.forward, attn._dflash_fused = types.MethodType(forward, attn), True
    return True


def fuse_layer(layer) -> list[str]:
    """Fuse what this decoder layer has: its MLP, and its Gated DeltaNet's input projections. What was fused."""
    done = []
    if fuse_mlp(getattr(layer, "mlp", None)):
        done.append("mlp")
    attn = getattr(layer, "linear_attn", None)
    if attn is not None and fuse_gated_deltanet(attn):
        done.append("linear_attn")
    return done


def unfuse_layer(layer) -> None:
    """Back to transformers' forwards (the weights stay views into the concatenated buffer, with the same values)."""
    for module, buffer in ((getattr(layer, "mlp", None), "gate_up_weight"),
                           (getattr(layer, "linear_attn", None), "in_proj_weight")):
        if getattr(module, "_dflash_fused", False):
            del module.forward, module._dflash_fused
            del module._buffers[buffer]
