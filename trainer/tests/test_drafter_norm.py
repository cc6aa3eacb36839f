"""The drafter's RMSNorm: the fused kernel eager decoding runs computes what the explicit ops (the compiled
training graph's) compute, bit for bit, in fp32 and bf16, with fp32 (training) and bf16 (decoding) weights."""

from __future__ import annotations

import pytest
import torch

from dflash_trainer.model.drafter import RMSNorm


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
