"""dflash-synthesize-prompts on the tiny target (random weights, the tiny ChatML tokenizer): the pre-query prefix,
what is kept and why the rest is refused, held-out prompts kept out, reuse of an earlier file, bad input refused
before anything is written. The proof's use of it (training data beside the regenerated answers) is in
test_proof_tiny.py."""

from __future__ import annotations

import json
import os

import pytest
from transformers import AutoTokenizer

from dflash_trainer.prep.heldout import HeldOut, words
from dflash_trainer.prep.synthesize import (SHIPPED_SYSTEM_PROMPTS, PromptFilter, _write, main, pre_query_ids,
                                            read_system_prompts, synthesize_prompts)

# the tiny target writes a whole prompt (an end-of-turn within 128 tokens) in about 1 sample of 16
TINY = dict(batch_size=64, max_attempts=128, seed=0, log=lambda *_: None)


def read_prompts(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    assert all(list(r) == ["messages"] and [m["role"] for m in r["messages"]] == ["user"] for r in rows)
    return [r["messages"][0]["content"] for r in rows]


def test_the_prefix_is_the_template_up_to_the_users_message(chat_target):
    tok = AutoTokenizer.from_pretrained(chat_target)
    assert pre_query_ids(tok) == tok.convert_tokens_to_ids(["<|im_start|>", "user"])
    # a template that adds a default system prompt (as SmolLM2's does) keeps it in the prefix
    tok.chat_template = ("{{ '<|im_start|>system\nyou are a helpful model<|im_end|>\n' }}" + tok.chat_template)
    assert tok.convert_ids_to_tokens(pre_query_ids(tok)) == [
        "<|im_start|>", "system", "you", "are", "a", "helpful", "model", "<|im_end|>", "<|im_start|>", "user"]
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}{% endfor %}"
    with pytest.raises(ValueError, match="drops the user's message"):
        pre_query_ids(tok)


def test_the_filter_names_why_a_sample_is_refused(chat_target):
    tok = AutoTokenizer.from_pretrained(chat_target)
    eos = tok.eos_token_id
    keep = PromptFilter(tok, {eos}, min_words=3, guard=HeldOut(["please count from one to ten"]))

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]
    assert keep.reason(ids("say red green blue")) == ("truncated", "")            # no end of turn
    assert keep.reason(ids("hello you") + [eos])[0] == "too_short"
    assert keep.reason(ids("say red") + [tok.convert_tokens_to_ids("<|MASK|>")] + [eos])[0] == "special_token"
    assert keep.reason(ids("please count from one to ten and then stop") + [eos])[0] == "held_out"
    assert keep.reason(ids("say red green blue") + [eos]) == (None, "say red green blue")
    assert keep.reason(ids("say red , green blue !") + [eos])[0] == "duplicate"  # the same words


def test_synthesized_prompts_are_whole_distinct_and_kept_from_the_held_out_sets(chat_target, tmp_path):
    first = tmp_path / "a.jsonl"
    stats = synthesize_prompts(chat_target, str(first), 6, **TINY)
    prompts = read_prompts(first)
    assert 1 <= stats["kept"] == len(prompts) <= 6 and not stats["reused"]
    # every sample is counted once: kept, refused by reason, or past --num-prompts in the last batch
    assert stats["attempts"] == stats["kept"] + stats["surplus"] + sum(stats["refused"].values())
    assert stats["refused"]["truncated"] > 0  # a random target rarely ends its turn
    assert len({tuple(words(p)) for p in prompts}) == len(prompts) and all(len(words(p)) >= 3 for p in prompts)
    assert not any("<|" in p for p in prompts)

    # the same seed samples the same texts: with them held out, none is kept again
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n" for p in prompts))
    again = synthesize_prompts(chat_target, str(tmp_path / "b.jsonl"), 6, held_out=(str(held),), **TINY)
    assert again["refused"]["held_out"] >= len(prompts)
    assert not set(read_prompts(tmp_path / "b.jsonl")) & set(prompts)


def test_a_rerun_reuses_the_file_and_other_settings_rewrite_it(chat_target, tmp_path):
    out = tmp_path / "s.jsonl"
    made = synthesize_prompts(chat_target, str(out), 3, **TINY)
    before = (out.read_text(), os.stat(out).st_mtime_ns)
    reused = synthesize_prompts(chat_target, str(out), 3, **TINY)
    assert reused == dict(made, reused=True) and (out.read_text(), os.stat(out).st_mtime_ns) == before
    # another run's data is only read: other settings are refused there, before anything is written
    with pytest.raises(ValueError, match="holds no synthesis of these settings"):
        synthesize_prompts(chat_target, str(out), 3, reuse_only=True, **dict(TINY, seed=1))
    assert (out.read_text(), os.stat(out).st_mtime_ns) == before
    other = synthesize_prompts(chat_target, str(out), 3, **dict(TINY, seed=1))
    assert not other["reused"] and json.load(open(f"{out}.stats.json"))["settings"]["seed"] == 1


@pytest.mark.parametrize("argv, message", [
    (["--num-prompts", "0"], "--num-prompts must be at least 1"),
    (["--num-prompts", "4", "--temperature", "0"], "--temperature must be above 0"),
    (["--num-prompts", "4", "--max-attempts", "2"], "--max-attempts 2 is below --num-prompts 4"),
    (["--num-prompts", "4", "--held-out", "/nonexistent.jsonl"], "no such file"),
])
def test_bad_input_is_one_line_and_writes_nothing(chat_target, tmp_path, capsys, argv, message):
    out = tmp_path / "s.jsonl"
    assert main(["--target-model", chat_target, "--out", str(out), "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dflash-synthesize-prompts: error:") and message in err and "\n" not in err
    assert not os.listdir(tmp_path)


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    out = tmp_path / "s.jsonl"
    _write(str(out), ["first prompt here"])
    before = out.read_text()

    def broken():
        yield "a prompt"
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        _write(str(out), broken())
    assert out.read_text() == before and os.listdir(tmp_path) == ["s.jsonl"]


def test_system_prompts_take_turns_with_the_templates_own_prefix(chat_target, tmp_path):
    tok = AutoTokenizer.from_pretrained(chat_target)
    systems = tmp_path / "systems.txt"
    systems.write_text("say red green blue\n\nsay blue\n")  # words the tiny tokenizer knows
    assert read_system_prompts(str(systems)) == ["say red green blue", "say blue"]
    own, steered = pre_query_ids(tok), pre_query_ids(tok, "say red green blue")
    assert "system say red green blue" in tok.decode(steered) and "red" not in tok.decode(own)
    assert steered[-len(own):] == own  # the tiny template has no default system prompt: both end at the user's turn
    out = tmp_path / "s.jsonl"
    stats = synthesize_prompts(chat_target, str(out), 6, system_prompts=str(systems), **TINY)
    assert len(stats["kept_by_system_prompt"]) == 3 and sum(stats["kept_by_system_prompt"]) == stats["kept"]
    assert json.load(open(f"{out}.stats.json"))["settings"]["system_prompts"] == read_system_prompts(str(systems))
    # the same file: reused; without it: another synthesis (and one made before the flag existed stays reusable)
    assert synthesize_prompts(chat_target, str(out), 6, system_prompts=str(systems), **TINY)["reused"]
    plain = synthesize_prompts(chat_target, str(out), 6, **TINY)
    assert not plain["reused"] and "kept_by_system_prompt" not in plain
    assert "system_prompts" not in json.load(open(f"{out}.stats.json"))["settings"]
    # the shipped file reads, and an empty one is refused before anything is sampled
    assert len(read_system_prompts(SHIPPED_SYSTEM_PROMPTS)) == 8
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="holds no system message"):
        synthesize_prompts(chat_target, str(tmp_path / "e.jsonl"), 6, system_prompts=str(empty), **TINY)
    assert not (tmp_path / "e.jsonl").exists()
