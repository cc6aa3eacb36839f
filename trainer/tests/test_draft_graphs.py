"""The drafter's padded block forward (eval/draft_graphs.py), which CUDA graphs replay, on the CPU without capture:
the context padded to a bucket with a mask gives the unpadded forward's logits, whatever a longer context left in
the padding, and decoding with it is lossless with the same accepted lengths. The capture itself: test_cuda.py."""

from __future__ import annotations

import pytest
import torch

from dflash_trainer.eval.draft_graphs import GraphedBlock, padded_block_logits
from dflash_trainer.eval.spec_decode import DFlashProposer, NoDraft, speculative_decode
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig

from test_spec_decode import BLOCK, drafter, target  # noqa: F401 - the tiny target and drafter fixtures

BUCKET = 8


def _taps(drafter, T, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(T, drafter.cfg.hidden_size, generator=g) for _ in drafter.cfg.target_layer_ids]


def test_the_padded_forward_gives_the_unpadded_logits_whatever_the_padding_holds(drafter):
    graphed = GraphedBlock(drafter, BUCKET, capture=False)
    eager = DFlashProposer(drafter)
    # a bucket's buffer reused: 7 positions, then 2 (rows 2-6 still hold the first context), then 8 (full), 9 (next)
    for T, seed in ((7, 0), (2, 1), (8, 2), (9, 3), (1, 4)):
        taps, tokens = _taps(drafter, T, seed), list(range(100, 100 + T + 1))
        want = eager.block_logits(tokens, taps)
        drafts = graphed.drafts(tokens[-1], taps)
        b = graphed._bucket_for(T)
        assert b.ctx.shape[1] == -(-T // BUCKET) * BUCKET and int(b.num_ctx) == T
        if T == 2:
            assert b.ctx[0, 2:7].abs().sum() > 0  # the padding is the last context's, not zeros
        with torch.no_grad():
            got = padded_block_logits(drafter, b.ctx, b.ids, b.num_ctx)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert drafts.tolist() == want[1:].argmax(-1).tolist()
    assert graphed.captured == 0 and sorted(graphed._buckets) == [8, 16]


def test_decoding_with_the_padded_forward_is_lossless_with_the_same_accepted_lengths(target, drafter):
    for prompt in ([5, 17, 33, 2, 90, 41], list(range(40, 52))):  # contexts cross the bucket of 8
        plain = speculative_decode(target, prompt, NoDraft(), BLOCK, 20)
        eager = speculative_decode(target, prompt, DFlashProposer(drafter), BLOCK, 20)
        proposer = DFlashProposer(drafter)
        proposer.graphs = GraphedBlock(drafter, BUCKET, capture=False)  # what cuda_graphs=True builds, uncaptured
        padded = speculative_decode(target, prompt, proposer, BLOCK, 20)
        assert padded.tokens == plain.tokens == eager.tokens
        assert padded.accept_lengths == eager.accept_lengths


def test_cuda_graphs_are_refused_off_cuda_and_for_a_length_dependent_rope(drafter):
    with pytest.raises(ValueError, match="need it on a CUDA device"):
        DFlashProposer(drafter, cuda_graphs=True)
    cfg = DrafterConfig.from_dict(drafter.cfg.to_dict() | {"rope_parameters": {"rope_type": "longrope"}})
    with pytest.raises(ValueError, match="rope_type 'longrope' depends on the length"):
        GraphedBlock(DFlashDrafter(cfg), BUCKET)
