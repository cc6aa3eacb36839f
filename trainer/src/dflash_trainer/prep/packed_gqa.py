"""Grouped-query attention for one new token without copying the KV cache per query head, as a transformers
attention function (`attn_implementation="packed_gqa_decode"`), for batched generation with a padding mask.

transformers' `sdpa` attention repeats every cached key and value once per query head of its group (`repeat_kv`)
whenever there is a mask (left-padded batches always have one), before the versions that pack the group instead
(5.17, on the lent GPU machines, repeats; 5.24 packs). At SmolLM2's 9 query / 3 KV heads and a batch of 2,048 that is
a copy three times the size of the whole cache at every decoding step. Packing the group's query heads as the query
positions of their one KV head (the mask is the same for each) gives the same attention over the cache as it is.
Anything else (prefill, no groups, a per-head mask) goes to transformers' own sdpa."""

from __future__ import annotations

# (no "flash" in the name: transformers takes any name containing it for a flash-attention kernel)
NAME = "packed_gqa_decode"


def packed_gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                         is_causal=None, **kwargs):
    """transformers' attention-function contract: query (B, H, q, D), key/value (B, KV, L, D) -> ((B, q, H, D),
    None)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    groups = getattr(module, "num_key_value_groups", 1)
    per_head_mask = attention_mask is not None and attention_mask.shape[1] != 1
    if query.shape[2] != 1 or groups == 1 or per_head_mask or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, heads, _, dim = query.shape
    packed = query.reshape(batch, heads // groups, groups, dim)  # the group's heads as its KV head's queries
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=False)
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def register() -> str:
    """Registers the attention (and sdpa's masks for it) with transformers, once per process; returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(NAME, packed_gqa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
