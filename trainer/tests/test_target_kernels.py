"""The seed family's target kernels (issue 31): which linear-attention code runs, the refusal of transformers' torch
fallback on a GPU (simulated: this CPU venv has no flash-linear-attention, as a GPU container without the fla extra)
and its opt-in, in dflash-train's start and in --check; the compiled layers' conv as shifted sums."""

import types

import pytest
import torch

from dflash_trainer import cli
from dflash_trainer.config import StartupError
from dflash_trainer.config.preflight import check_kernels
from dflash_trainer.model import target_kernels
from dflash_trainer.model.target import layer_kinds, opaque_kernel, shifted_causal_conv
from dflash_trainer.prep import make_tiny


@pytest.fixture(scope="module")
def hybrid_config():
    return make_tiny.qwen3_5_config(num_layers=8)


def test_this_venv_has_no_fla():  # the premise of the simulated GPU container
    assert target_kernels.found_kernels() == {"fla": None, "causal_conv1d": None}


def test_fallback_refused_on_a_gpu_in_one_line_naming_the_extra(hybrid_config):
    with pytest.raises(StartupError) as e:
        target_kernels.check(hybrid_config, on_gpu=True, allow_slow=False)
    msg = str(e.value)
    assert "\n" not in msg and "6 linear-attention layers" in msg
    assert "dflash_trainer[fla]" in msg and "DFLASH_SLOW_LINEAR_ATTENTION=1" in msg


def test_opt_in_runs_the_fallback_and_says_so(hybrid_config):
    line = target_kernels.check(hybrid_config, on_gpu=True, allow_slow=True)
    assert "torch fallback" in line and line.endswith("(DFLASH_SLOW_LINEAR_ATTENTION=1)")
    assert cli.env_setting("slow_linear_attention", {"DFLASH_SLOW_LINEAR_ATTENTION": "1"}) is True
    assert cli.env_setting("slow_linear_attention", {}) is False


def test_cpu_and_other_families_are_not_refused(hybrid_config):
    assert "torch fallback" in target_kernels.check(hybrid_config, on_gpu=False, allow_slow=False)
    qwen3 = make_tiny.qwen3_config()
    assert target_kernels.check(qwen3, on_gpu=True, allow_slow=False).startswith("no linear-attention layers")
    with_fla = {"fla": "0.6.0", "causal_conv1d": None}
    line = target_kernels.check(hybrid_config, on_gpu=True, allow_slow=False, found=with_fla)
    assert "flash-linear-attention 0.6.0" in line and "causal conv by torch" in line


def test_check_reports_the_refusal_for_a_gpu_job(hybrid_config):
    cfg = types.SimpleNamespace(device="auto", target_gpus=[0], drafter_gpus=[1], slow_linear_attention=False)
    config = hybrid_config.to_dict()
    line, problems = check_kernels(cfg, config, cuda=True)
    assert line is None and len(problems) == 1 and "DFLASH_SLOW_LINEAR_ATTENTION=1" in problems[0]
    cfg.slow_linear_attention = True
    line, problems = check_kernels(cfg, config, cuda=True)
    assert problems == [] and "torch fallback" in line
    cfg.slow_linear_attention = False  # the same job on a host without CUDA trains on the CPU: not refused
    assert check_kernels(cfg, config, cuda=False)[1] == []


def test_layer_kinds(hybrid_config):
    assert layer_kinds(hybrid_config, 8) == (["linear_attention"] * 3 + ["full_attention"]) * 2
    assert layer_kinds(make_tiny.qwen3_config(), 2) == ["default", "default"]


def test_shifted_conv_equals_transformers_reference():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5
    reference = getattr(qwen3_5.causal_conv1d_fn, "__wrapped__", qwen3_5.causal_conv1d_fn)
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 24, 70, generator=g), torch.randn(24, 4, generator=g), torch.randn(24, generator=g)
    for bias in (None, b):
        torch.testing.assert_close(shifted_causal_conv(x, w, bias, "silu"), reference(x, w, bias, "silu"))


def _kernel_inputs_in_compiled_layer(monkeypatch, wrap):
    """A tiny Gated DeltaNet decoder layer compiled on the CPU as dflash-train compiles it, with transformers'
    reference kernel behind `wrap` (fla's stand-in: it is a Triton kernel); returns each call's tensor inputs'
    contiguity and the layer's output against the eager layer's."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5
    from dflash_trainer.model.fused_projections import fuse_layer
    reference, seen = qwen3_5.torch_chunk_gated_delta_rule, []

    def recording_kernel(*args, **kwargs):
        tensors = {**dict(zip("qkv", args)), **kwargs}
        seen.append({n: t.is_contiguous() for n, t in tensors.items() if isinstance(t, torch.Tensor)})
        return reference(*args, **kwargs)

    text = make_tiny.qwen3_5_config(num_layers=1).get_text_config()
    torch.manual_seed(0)
    layer = qwen3_5.Qwen3_5DecoderLayer(text, 0).eval()
    x, rope = torch.randn(1, 48, text.hidden_size), (torch.ones(1, 48, 4), torch.zeros(1, 48, 4))
    with torch.no_grad():
        eager = layer(x, position_embeddings=rope)
        monkeypatch.setattr(qwen3_5, "torch_chunk_gated_delta_rule", wrap(recording_kernel))
        monkeypatch.setattr(qwen3_5, "causal_conv1d_fn", shifted_causal_conv)
        fuse_layer(layer)
        layer.compile()
        compiled = layer(x, position_embeddings=rope)
    torch._dynamo.reset()
    return seen, (compiled - eager).abs().max().item()


def test_the_opaque_kernel_gets_contiguous_inputs_from_the_compiled_graph(monkeypatch):
    # Premise: left out of the graph as it is, the kernel gets views (the value heads in the conv's channel-major
    # layout), which fla then copies in separate eager kernels.
    seen, _ = _kernel_inputs_in_compiled_layer(monkeypatch, lambda fn: torch.compiler.disable(fn, recursive=True))
    assert seen and not all(seen[0].values())
    seen, diff = _kernel_inputs_in_compiled_layer(monkeypatch, opaque_kernel)
    assert seen and all(seen[0].values()) and set(seen[0]) >= {"q", "k", "v", "g", "beta"}
    assert diff < 1e-4
