"""Replayed decoding (eval/replay.py) against the decode it replays, on the tiny random target: the same steps for
a scripted proposer (EOS and the token cap included), the batched drafts equal the one-block drafts at every anchor,
and DFlash and prompt lookup replayed give the decode's accept lengths."""

from __future__ import annotations

import pytest
import torch

from dflash_trainer.eval.replay import (accept_length_by_position, dflash_drafts, replay, replay_dflash,
                                        replay_proposer)
from dflash_trainer.eval.spec_decode import (DecodeResult, DFlashProposer, Proposer, PromptLookupProposer,
                                             reference_greedy, speculative_decode)
from test_spec_decode import BLOCK, drafter, target  # noqa: F401 - the tiny target and its random drafter

PROMPTS = [[5, 17, 33, 2, 90, 41], [300, 301, 302, 303, 300, 301, 302], list(range(40, 70))]


class Scripted(Proposer):
    """Drafts the target's greedy continuation with every token at a position divisible by 3 made wrong: accept
    lengths of every size, decided by the positions alone."""

    def __init__(self, full, vocab):
        self.full, self.vocab = full, vocab

    def propose(self, tokens, taps, num):
        start = len(tokens)
        return [t if (start + i) % 3 else (t + 1) % self.vocab for i, t in enumerate(self.full[start:start + num])]


@pytest.mark.parametrize("max_new, eos_at", [(24, None), (7, None), (24, 9)])
def test_replay_takes_the_decodes_steps(target, max_new, eos_at):
    lengths = []
    for prompt in PROMPTS:
        greedy = reference_greedy(target, prompt, 40).tokens
        eos = {greedy[eos_at]} if eos_at is not None else set()
        proposer = Scripted(prompt + greedy, target.config.vocab_size)
        decoded = speculative_decode(target, prompt, proposer, BLOCK, max_new, eos)
        replayed = replay(prompt, decoded.tokens, lambda _a, tokens, num: proposer.propose(tokens, None, num),
                          BLOCK, max_new)
        assert replayed.accept_lengths == decoded.accept_lengths and replayed.num_proposed == decoded.num_proposed
        assert replayed.num_target_forwards == decoded.num_target_forwards
        # every anchor's length is kept; the decode's steps are those of the anchors it visited
        assert len(replayed.anchor_lengths) == len(decoded.tokens) - 1
        kept = 1
        for length in decoded.accept_lengths:
            assert replayed.anchor_lengths[kept - 1] == length
            kept += length
        lengths += decoded.accept_lengths
    assert len(set(lengths)) > 1  # the script gives runs of several lengths


def test_batched_drafts_are_the_one_block_drafts_at_every_anchor(target, drafter):
    prompt = PROMPTS[0]
    reference = reference_greedy(target, prompt, 12).tokens
    batched = dflash_drafts(target, drafter, prompt, reference)
    assert batched.shape == (len(reference), BLOCK - 1)
    proposer, tokens = DFlashProposer(drafter), prompt + reference
    for j in range(len(reference)):
        anchor = len(prompt) + j
        with torch.no_grad():
            out = target(input_ids=torch.tensor([tokens[:anchor]]), output_hidden_states=True)
        taps = [out.hidden_states[i + 1][0] for i in drafter.cfg.target_layer_ids]
        one = proposer.block_logits(tokens[:anchor + 1], taps)[1:].argmax(-1)
        assert torch.equal(batched[j], one), j


def test_replayed_methods_give_the_decodes_accept_lengths(target, drafter):
    lookup_lengths = []
    for prompt in PROMPTS:
        reference = reference_greedy(target, prompt, 24).tokens
        decoded = speculative_decode(target, prompt, DFlashProposer(drafter), BLOCK, 24)
        assert replay_dflash(target, drafter, prompt, reference, BLOCK, 24).accept_lengths == decoded.accept_lengths
        lookup = PromptLookupProposer(3)
        decoded = speculative_decode(target, prompt, lookup, BLOCK, 24)
        assert replay_proposer(lookup, prompt, reference, BLOCK, 24).accept_lengths == decoded.accept_lengths
        lookup_lengths += decoded.accept_lengths
    assert max(lookup_lengths) > 1  # prompt lookup accepts drafts here: the comparison is not all ones


def test_accept_length_by_position_averages_every_anchor_in_each_bucket():
    a = DecodeResult(tokens=[0] * 11, anchor_lengths=[1, 3, 1, 1, 1, 1, 1, 1, 4, 2])   # anchors 0-7, then 8-9
    b = DecodeResult(tokens=[0] * 3, anchor_lengths=[2, 2])
    assert accept_length_by_position([a, b]) == {"0-7": 14 / 10, "8-15": 3.0, "16-31": None, "32-63": None,
                                                 "64+": None}
