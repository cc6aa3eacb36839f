"""Fused projections of the frozen target (issue 31): the seed family's layers with their input projections as one
GEMM give the hidden states transformers' own layers give, hold no second copy of a weight, fall back to
transformers' forward for a call they do not fuse, and unfuse back to transformers' forward exactly."""

import pytest
import torch

from dflash_trainer.model.fused_projections import fuse_layer, unfuse_layer
from dflash_trainer.model.target import COMPILE_BY_KIND, FUSED, FrozenTarget, layer_kinds
from dflash_trainer.prep import make_tiny


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hybrid") / "target")
    make_tiny.write_target(path, seed=3, family="qwen3_5")
    return FrozenTarget(path, torch.device("cpu"), [1, 4, 5], need_last_hidden=True)


def forward(target, ids):
    taps, last = target(ids)
    return [t.clone() for t in taps], None if last is None else last.clone()


def test_fused_layers_give_transformers_hidden_states_and_unfuse_exactly(hybrid):
    ids = torch.randint(0, 500, (2, 37), generator=torch.Generator().manual_seed(0))
    ref_taps, ref_last = forward(hybrid, ids)
    layers = hybrid.model.model.layers
    fused = [fuse_layer(layer) for layer in layers]
    try:
        kinds = layer_kinds(hybrid.config, len(layers))
        assert [f for f, k in zip(fused, kinds) if k == "linear_attention"] == [["mlp", "linear_attn"]] * 6
        assert [f for f, k in zip(fused, kinds) if k == "full_attention"] == [["mlp"]] * 2
        assert fuse_layer(layers[0]) == ["mlp", "linear_attn"]  # a second call changes nothing
        # every projection's weight is a view into the one concatenated buffer: nothing is held twice
        attn, mlp = layers[0].linear_attn, layers[0].mlp
        for module, names, buffer in ((attn, ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"), "in_proj_weight"),
                                      (mlp, ("gate_proj", "up_proj"), "gate_up_weight")):
            storage = getattr(module, buffer).untyped_storage().data_ptr()
            assert all(getattr(module, n).weight.untyped_storage().data_ptr() == storage for n in names)
            assert buffer not in module.state_dict()
        # the target's own forward takes the fused path: no original projection module runs
        unfused_calls = []
        hooks = [getattr(layer.linear_attn if n.startswith("in_proj") else layer.mlp, n).register_forward_hook(
                     lambda *_: unfused_calls.append(1))
                 for layer, kind in zip(layers, kinds) for n in (
                     ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "gate_proj", "up_proj")
                     if kind == "linear_attention" else ("gate_proj", "up_proj"))]
        try:
            taps, last = forward(hybrid, ids)
        finally:
            for hook in hooks:
                hook.remove()
        assert len(hooks) == 6 * 6 + 2 * 2 and not unfused_calls
        # one GEMM sums in another order than four: fp32 rounding, grown through 8 random layers (|taps| up to ~20)
        for got, want in zip(taps + [last], ref_taps + [ref_last]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        # a call the fusion does not cover (a padding mask) runs transformers' own forward, on the same weights
        x = torch.randn(2, 37, hybrid.config.get_text_config().hidden_size)
        mask = torch.ones(2, 37, dtype=torch.long)
        masked = attn(x, attention_mask=mask)
        torch.testing.assert_close(masked, type(attn).forward(attn, x, attention_mask=mask))
        # and the fused call is the same function, layer by layer within rounding
        torch.testing.assert_close(attn(x), masked, rtol=1e-5, atol=1e-5 * masked.abs().max().item())
    finally:
        for layer in layers:
            unfuse_layer(layer)
    assert not hasattr(layers[0].mlp, "gate_up_weight") and "forward" not in vars(layers[0].linear_attn)
    taps, last = forward(hybrid, ids)
    assert all(torch.equal(a, b) for a, b in zip(taps + [last], ref_taps + [ref_last]))


def test_qwen3_mlp_fuses_too_and_the_kept_table_fuses_only_measured_kinds(tiny):
    target = FrozenTarget(tiny["target"], torch.device("cpu"), [1, 4], need_last_hidden=False)
    ids = torch.randint(0, 500, (1, 29), generator=torch.Generator().manual_seed(1))
    ref, _ = forward(target, ids)
    assert fuse_layer(target.model.model.layers[2]) == ["mlp"]
    got, _ = forward(target, ids)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the seed family's kinds fuse (measured faster on an H200); Qwen3/Llama layers were not measured fused
    assert COMPILE_BY_KIND["linear_attention"].endswith(FUSED) and COMPILE_BY_KIND["full_attention"].endswith(FUSED)
    assert not COMPILE_BY_KIND["default"].endswith(FUSED)
