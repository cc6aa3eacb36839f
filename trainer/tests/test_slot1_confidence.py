"""proofs/slot1_confidence.py: slot 1's hits at every anchor are the replayed steps that accept a token, the
confidences are the target's own top-1 probabilities, and the buckets count and share them as the table says."""

from __future__ import annotations

import pytest
import torch

import proofs.slot1_confidence as slot1_confidence
from dflash_trainer.eval.replay import replay, replay_dflash
from dflash_trainer.eval.spec_decode import reference_greedy
from proofs.slot1_confidence import MIN_AGREEMENT, anchor_hits, buckets
from test_spec_decode import BLOCK, drafter, target  # noqa: F401 - the tiny target and its random drafter

PROMPTS = [[5, 17, 33, 2, 90, 41], [300, 301, 302, 303, 300, 301, 302], list(range(40, 70))]


def test_hits_are_the_replayed_steps_that_accept_slot_1_and_confidence_is_the_targets(target, drafter):
    for prompt in PROMPTS:
        reference = reference_greedy(target, prompt, 20).tokens
        confidence, hits, agrees = anchor_hits(target, drafter, prompt, reference)
        assert len(confidence) == len(hits) == len(agrees) == len(reference) - 1
        assert sum(agrees) >= MIN_AGREEMENT * len(agrees)  # the prompt's own greedy decode
        replayed = replay_dflash(target, drafter, prompt, reference, BLOCK, len(reference))
        assert hits[:-1] == [length >= 2 for length in replayed.anchor_lengths[:len(reference) - 2]]
        tokens = prompt + reference
        for j in (0, len(reference) // 2, len(reference) - 2):  # a forward of the prefix up to anchor r_j alone
            with torch.no_grad():
                probs = target(input_ids=torch.tensor([tokens[:len(prompt) + j + 1]])).logits[0, -1].softmax(-1)
            assert confidence[j] == pytest.approx(probs.max().item(), abs=1e-5)
            assert 0.0 < confidence[j] <= 1.0


def test_hits_align_each_anchor_with_the_next_reference_token(target, drafter, monkeypatch):
    """The random drafter hits nothing, so drafts scripted from the reference (every third position wrong) stand in
    for it: a hit at anchor r_j must be exactly a replayed step there that accepts slot 1."""
    prompt = PROMPTS[2]
    reference = reference_greedy(target, prompt, 20).tokens
    start, vocab = len(prompt), target.config.vocab_size
    full = prompt + reference + [0] * BLOCK
    drafts = torch.tensor([[t if (a + 1 + i) % 3 else (t + 1) % vocab for i, t in enumerate(full[a + 1:a + BLOCK])]
                           for a in range(start, start + len(reference))])
    real = slot1_confidence.dflash_drafts_and_target_logits
    monkeypatch.setattr(slot1_confidence, "dflash_drafts_and_target_logits", lambda *a: (drafts, real(*a)[1]))
    _, hits, _ = anchor_hits(target, drafter, prompt, reference)
    replayed = replay(prompt, reference, lambda anchor, _t, num: drafts[anchor - start][:num].tolist(), BLOCK,
                      len(reference))
    # (at the last anchor, r_{N-2}, the decode has one token left to make and drafts nothing)
    assert hits[:-1] == [length >= 2 for length in replayed.anchor_lengths[:len(reference) - 2]]
    assert 0 < sum(hits) < len(hits)


def test_another_prompts_reference_fails_the_agreement_check(target, drafter):
    reference = reference_greedy(target, PROMPTS[2], 20).tokens
    _, _, agrees = anchor_hits(target, drafter, PROMPTS[0], reference)  # PROMPTS[2]'s decode after PROMPTS[0]
    assert sum(agrees) < MIN_AGREEMENT * len(agrees)


def test_buckets_count_each_anchor_once_and_share_the_misses():
    confidence = [0.1, 0.2, 0.4, 0.6, 0.95, 0.995, 1.0, 0.3]
    hits = [False, True, False, True, True, True, False, False]
    rows = buckets(confidence, hits, edges=(0.0, 0.3, 0.9, 0.99))
    assert [r["anchors"] for r in rows] == [2, 3, 1, 2]  # 0.3 opens the second bucket; 1.0 falls in the last
    assert [r["slot1"] for r in rows] == [0.5, pytest.approx(1 / 3), 1.0, 0.5]
    assert [r["share_of_misses"] for r in rows] == [0.25, 0.5, 0.0, 0.25]
    assert sum(r["share"] for r in rows) == pytest.approx(1.0) and rows[-1]["to"] == 1.0
    empty = buckets([0.5], [True], edges=(0.0, 0.9))
    assert empty[1]["anchors"] == 0 and empty[1]["slot1"] is None and empty[0]["share_of_misses"] is None
