"""The drafter's eager kernels compute what the explicit ops compute, bit for bit, in fp32 and bf16: RMSNorm's fused
kernel against the compiled training graph's ops (fp32 and bf16 weights), and RoPE's products that upcast inside
their kernels against an explicit x.float() (the formula before 2026-12-07)."""

from __future__ import annotations

import pytest
import torch

from dflash_trainer.model.drafter import RMSNorm, apply_rope, rope_cos_sin


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                             (torch.bfloat16, torch.bfloat16)])
def test_eager_fused_norm_equals_the_compiled_graphs_explicit_ops(x_dtype, w_dtype):
    torch.manual_seed(0)
    norm = RMSNorm(96, eps=1e-6).to(w_dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96))
    x = (torch.randn(3, 17, 96) * 4).to(x_dtype)
    torch._dynamo.reset()
    explicit = torch.compile(norm.forward, backend="eager", fullgraph=True)  # dynamo traces the explicit branch
    with torch.no_grad():
        eager, traced = norm(x), explicit(x)
    assert eager.dtype == traced.dtype == torch.promote_types(x_dtype, w_dtype)
    assert torch.equal(eager, traced)
    # and the normalization is what it claims: unit root-mean-square before the weight
    unit = RMSNorm(96, eps=0.0)(x.float())
    torch.testing.assert_close(unit.pow(2).mean(-1), torch.ones(3, 17))


def _rope_with_explicit_upcast(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


@pytest.mark.parametrize("x_dtype,cos_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                               (torch.bfloat16, torch.bfloat16)])
def test_rope_upcasts_inside_its_products_as_the_explicit_upcast_did(x_dtype, cos_dtype):
    torch.manual_seed(0)
    x = (torch.randn(2, 3, 40, 64) * 5).to(x_dtype)
    cos, sin = (t.to(cos_dtype) for t in rope_cos_sin(torch.arange(1000, 1040)[None], 64, 10_000.0))
    out = apply_rope(x, cos, sin)
    assert out.dtype == x_dtype
    assert torch.equal(out, _rope_with_explicit_upcast(x, cos, sin))
    # a partial rotation leaves the rest of each head as it was
    part = apply_rope(x, cos[..., :32], sin[..., :32])
    assert torch.equal(part[..., 32:], x[..., 32:])
    assert torch.equal(part[..., :32], _rope_with_explicit_upcast(x[..., :32], cos[..., :32], sin[..., :32]))
