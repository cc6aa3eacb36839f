"""Speculative decoding on the tiny random target: lossless, 1 <= τ <= B, oracle gives τ = B, n-gram lookup."""

from __future__ import annotations

import pytest
import torch

from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.prep.make_tiny import MASK_ID
from dflash_trainer.eval.spec_decode import (DFlashProposer, NoDraft, OracleProposer, PromptLookupProposer,
                                        reference_greedy, speculative_decode, summarize)

BLOCK = 4


@pytest.fixture(scope="module")
def target(tiny):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny["target"], dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(0)
    cfg = DrafterConfig.from_target(target.config, num_layers=1, target_layer_ids=[1, 3, 5], block_size=BLOCK,
                                    mask_token_id=MASK_ID)
    d = DFlashDrafter(cfg)
    d.load_frozen(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    return d.eval()


PROMPTS = [[5, 17, 33, 2, 90, 41], [300, 301, 302, 303, 7], list(range(40, 70))]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_untrained_drafter_is_lossless_and_tau_bounded(target, drafter, prompt):
    ref = reference_greedy(target, prompt, max_new_tokens=24)
    out = speculative_decode(target, prompt, DFlashProposer(drafter), BLOCK, 24)
    assert out.tokens == ref.tokens
    s = summarize([out], BLOCK)
    assert 1.0 <= s["tau"] <= BLOCK
    assert sum(out.accept_lengths) + 1 == len(out.tokens)  # prefill gives the first token


def test_plain_loop_matches_generate(target):
    for prompt in PROMPTS:
        assert speculative_decode(target, prompt, NoDraft(), BLOCK, 20).tokens == \
            reference_greedy(target, prompt, 20).tokens


def test_oracle_drafter_reaches_tau_equal_block(target):
    prompt = PROMPTS[0]
    ref = reference_greedy(target, prompt, max_new_tokens=1 + 5 * BLOCK + 2)
    out = speculative_decode(target, prompt, OracleProposer(prompt + ref.tokens), BLOCK, len(ref.tokens))
    assert out.tokens == ref.tokens
    assert out.accept_lengths[:-1] == [BLOCK] * (len(out.accept_lengths) - 1)  # every step but the last
    assert out.accept_lengths[-1] <= BLOCK
    s = summarize([out], BLOCK)
    assert s["slot_accept_rate"][0] == 1.0
    assert out.num_target_forwards == 1 + len(out.accept_lengths)


def test_wrong_drafts_are_rejected_and_output_stays_exact(target):
    """An oracle of the wrong continuation: every draft is rejected, τ = 1, output still the greedy one."""
    prompt = PROMPTS[1]
    ref = reference_greedy(target, prompt, 16)
    wrong = prompt + [(t + 1) % 500 for t in ref.tokens]
    out = speculative_decode(target, prompt, OracleProposer(wrong), BLOCK, 16)
    assert out.tokens == ref.tokens
    assert set(out.accept_lengths) == {1}


def test_eos_stops_inside_an_accepted_run(target):
    prompt = PROMPTS[2]
    ref = reference_greedy(target, prompt, 20)
    eos = ref.tokens[7]  # pretend the 8th greedy token is EOS
    first = ref.tokens.index(eos)
    ref_eos = reference_greedy(target, prompt, 20, eos_ids={eos})
    out = speculative_decode(target, prompt, OracleProposer(prompt + ref.tokens), BLOCK, 20, eos_ids={eos})
    assert out.tokens == ref.tokens[:first + 1] == ref_eos.tokens


def test_prompt_lookup_finds_repeated_ngram():
    p = PromptLookupProposer(max_ngram=3)
    tokens = [1, 2, 3, 9, 8, 7, 6, 5, 4, 1, 2, 3]
    assert p.propose(tokens, None, 3) == [9, 8, 7]
    assert p.propose(tokens, None, 10) == [9, 8, 7, 6, 5, 4, 1, 2, 3]
    assert p.propose([1, 2, 3, 4], None, 3) == []                 # no earlier occurrence
    assert p.propose([5, 1, 2, 6, 2], None, 2) == [6, 2]          # falls back to the 1-gram [2]
    assert p.propose([1, 2, 1, 2, 7, 1, 2], None, 2) == [7, 1]    # the most recent match wins


def test_prompt_lookup_decoding_is_lossless_and_gains_on_repetition(target):
    prompt = [11, 12, 13, 14] * 6
    ref = reference_greedy(target, prompt, 24)
    out = speculative_decode(target, prompt, PromptLookupProposer(3), BLOCK, 24)
    assert out.tokens == ref.tokens
    s = summarize([out], BLOCK)
    assert 1.0 <= s["tau"] <= BLOCK


def test_inference_block_equals_the_training_block(target, drafter):
    """The drafter at decode time (context = taps of positions < anchor only) computes the same logits as
    the training path (all positions, block-sparse mask hiding those >= anchor): train/inference agree."""
    from dflash_trainer.model.blocks import block_inputs, dense_block_mask
    seq = [5, 17, 33, 2, 90, 41, 300, 301, 302, 7, 8, 9, 100, 200, 150, 12, 13, 14, 15, 16]
    ids = torch.tensor([seq])
    with torch.no_grad():
        out = target.model(input_ids=ids, output_hidden_states=True, use_cache=False)
    taps = [out.hidden_states[i + 1] for i in drafter.cfg.target_layer_ids]  # as FrozenTarget does
    for a in (3, 9, 15):
        anchors, valid = torch.tensor([[a]]), torch.tensor([[True]])
        block_ids, block_pos = block_inputs(ids, anchors, BLOCK, MASK_ID)
        mask = dense_block_mask(anchors, valid, len(seq), BLOCK)
        with torch.no_grad():
            train_logits = drafter.logits(drafter(taps, block_ids, block_pos, mask)[0])
        infer_logits = DFlashProposer(drafter).block_logits(seq[:a + 1], [t[0, :a] for t in taps])
        torch.testing.assert_close(infer_logits, train_logits, rtol=1e-4, atol=1e-4)
