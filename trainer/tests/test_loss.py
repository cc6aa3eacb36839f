"""The chunked head loss against plain autograd, soft vs hard labels, metrics and schedules."""

import pytest
import torch

from dflash_trainer import loss
from dflash_trainer.config import HEAD_CHUNK_BYTES
from dflash_trainer.loss import (acceptance_proxy, add_uniform_noise, chunked_head_loss, head_chunk_rows,
                                 noise_amplitude, reference_head_loss)


def _inputs(soft, n=37, h=16, v=50):
    torch.manual_seed(0)
    hidden = torch.randn(n, h, requires_grad=True)
    weight = torch.randn(v, h)
    labels = torch.randint(0, v, (n,))
    w = torch.rand(n)
    target = torch.randn(n, h) if soft else None
    return hidden, weight, labels, w, target


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("chunk", [1, 8, 1000])
def test_chunked_equals_unchunked(soft, chunk):
    hidden, weight, labels, w, target = _inputs(soft)
    total, _ = chunked_head_loss(hidden, weight, labels, w, target, chunk=chunk)
    (grad,) = torch.autograd.grad(total * 0.7, hidden)
    ref = reference_head_loss(hidden, weight, labels, w, target)
    (ref_grad,) = torch.autograd.grad(ref * 0.7, hidden)
    assert torch.allclose(total, ref, rtol=1e-5, atol=1e-5)
    assert torch.allclose(grad, ref_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("vocab, rows", [(248320, 1024), (151936, 1024), (49152, 4096), (512, 4096),
                                         (10_000_000, 16)])
def test_default_head_chunk_keeps_one_chunks_logits_within_the_bound(vocab, rows):
    """The seed's 248k vocabulary gets 1024 rows (56.5 vs 61.2 GB peak at 4096 on an H200), SmolLM2's keeps 4096."""
    assert head_chunk_rows(vocab) == rows
    assert rows * vocab * 4 <= HEAD_CHUNK_BYTES
    assert head_chunk_rows(vocab, requested=77) == 77   # --head-chunk-size wins


def test_default_chunk_is_what_the_loss_runs(monkeypatch):
    """chunk=None (dflash-train's default) runs head_chunk_rows' chunks and still equals the reference."""
    hidden, weight, labels, w, _ = _inputs(False, n=37, v=50)
    monkeypatch.setattr(loss, "HEAD_CHUNK_BYTES", 50 * 4 * 8)          # 8 rows of 50 fp32 logits
    calls = []
    real = loss._hard_chunk
    monkeypatch.setattr(loss, "_hard_chunk", lambda h, *a: calls.append(h.shape[0]) or real(h, *a))
    total, _ = chunked_head_loss(hidden, weight, labels, w, None)
    assert calls == [8, 8, 8, 8, 5]
    assert torch.allclose(total, reference_head_loss(hidden, weight, labels, w), rtol=1e-5, atol=1e-5)


def test_soft_kl_equals_ce_for_one_hot_target():
    """With a one-hot target distribution, KL(q || p) = -log p[label] = CE."""
    hidden, weight, labels, w, _ = _inputs(False, v=16, h=16)
    weight = torch.eye(16)
    target = torch.nn.functional.one_hot(labels, 16).float() * 1e4     # softmax -> exactly one-hot
    hard, _ = chunked_head_loss(hidden, weight, labels, w, None, chunk=5)
    soft, correct = chunked_head_loss(hidden, weight, labels, w, target, chunk=5)
    assert torch.allclose(hard, soft, rtol=1e-6)
    (g_hard,) = torch.autograd.grad(chunked_head_loss(hidden, weight, labels, w, None, 5)[0], hidden)
    (g_soft,) = torch.autograd.grad(chunked_head_loss(hidden, weight, labels, w, target, 5)[0], hidden)
    assert torch.allclose(g_hard, g_soft, atol=1e-6)


def test_acceptance_proxy():
    assert acceptance_proxy([1.0, 1.0, 1.0, 1.0]) == 4.0
    assert acceptance_proxy([0.3, 0.0, 1.0]) == 1.0
    assert abs(acceptance_proxy([0.0, 0.5, 0.5]) - 1.75) < 1e-9


def test_noise_schedule_and_amplitude():
    assert noise_amplitude(0, 11, 0.05, 0.01) == pytest.approx(0.05)
    assert noise_amplitude(10, 11, 0.05, 0.01) == pytest.approx(0.01)
    assert noise_amplitude(5, 11, 0.05, 0.01) == pytest.approx(0.03)
    x = torch.zeros(1000)
    (y,) = add_uniform_noise([x], 0.05, torch.Generator().manual_seed(0))
    assert y.abs().max() <= 0.05 and y.abs().max() > 0.04 and abs(y.mean()) < 0.01


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("compiled", [False, True], ids=["padded-eager", "torch.compile"])
def test_padded_fixed_shape_chunks_equal_reference(soft, compiled, monkeypatch):
    """The CUDA path: fixed-size chunks (last one padded with zero-weight rows), optionally compiled."""
    import dflash_trainer.loss as loss_mod
    monkeypatch.setattr(loss_mod, "compile_head_loss", lambda device: True)
    if not compiled:
        monkeypatch.setattr(loss_mod, "_compiled", lambda fn: fn)
    hidden, weight, labels, w, target = _inputs(soft)
    total, correct = chunked_head_loss(hidden, weight, labels, w, target, chunk=16)   # 37 rows: 16+16+5(+11 pad)
    (grad,) = torch.autograd.grad(total, hidden)
    ref = reference_head_loss(hidden, weight, labels, w, target)
    (ref_grad,) = torch.autograd.grad(ref, hidden)
    assert correct.shape == (37,)
    assert torch.allclose(total, ref, rtol=1e-5, atol=1e-5)
    assert torch.allclose(grad, ref_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_soft_label_temperature_chunked_equals_reference(temperature, compiled, monkeypatch):
    """--soft-label-temperature divides the target's logits before the softmax, in every chunking and compiled."""
    if compiled:
        monkeypatch.setattr(loss, "compile_head_loss", lambda device: True)
    hidden, weight, labels, w, target = _inputs(True)
    total, correct = chunked_head_loss(hidden, weight, labels, w, target, chunk=16, temperature=temperature)
    (grad,) = torch.autograd.grad(total, hidden)
    ref = reference_head_loss(hidden, weight, labels, w, target, temperature=temperature)
    (ref_grad,) = torch.autograd.grad(ref, hidden)
    assert torch.allclose(total, ref, rtol=1e-5, atol=1e-5)
    assert torch.allclose(grad, ref_grad, rtol=1e-4, atol=1e-5)
    untempered, correct_1 = chunked_head_loss(hidden, weight, labels, w, target, chunk=16)
    assert not torch.allclose(total, untempered, rtol=1e-3)          # the flag changes the objective
    assert torch.equal(correct, correct_1)                           # but not which token is the target's top


def test_a_low_temperature_approaches_cross_entropy_on_the_targets_top_token():
    """T -> 0 turns the target's distribution into its argmax: the loss tends to CE against that token."""
    hidden, weight, _, w, target = _inputs(True)
    top = (target @ weight.T).argmax(-1)
    hard, _ = chunked_head_loss(hidden, weight, top, w, None, chunk=8)
    cold, _ = chunked_head_loss(hidden, weight, top, w, target, chunk=8, temperature=1e-3)
    warm, _ = chunked_head_loss(hidden, weight, top, w, target, chunk=8, temperature=1.0)
    assert torch.allclose(cold, hard, rtol=1e-4)
    assert abs(float((warm - hard).detach())) > 1e-2
