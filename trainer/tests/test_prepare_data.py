"""dflash-prepare-data on the tiny target + an offline word-level tokenizer with a ChatML template."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from dflash_trainer.data.batches import TokenizedDataset
from dflash_trainer.prep.prepare_data import main, prepare
from dflash_trainer.prep.tiny_tokenizer import synthetic_chats


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Local files only: nothing here may reach the hub."""
    import datasets
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(r if isinstance(r, str) else json.dumps(r))
            f.write("\n")
    return str(path)


def read_rows(out_dir):
    rows = []
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".parquet"):
            t = pq.read_table(os.path.join(out_dir, name))
            rows += list(zip(t.column("input_ids").to_pylist(), t.column("loss_mask").to_pylist()))
    return rows


def test_loss_mask_covers_exactly_the_assistant_tokens(chat_target, tmp_path):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(chat_target)
    conv = {"messages": [{"role": "system", "content": "you are a helpful tiny model"},
                         {"role": "user", "content": "count from one to three"},
                         {"role": "assistant", "content": "one two three ."},
                         {"role": "user", "content": "again"},
                         {"role": "assistant", "content": "one two three"}]}
    src = write_jsonl(tmp_path / "in.jsonl", [conv])
    stats = prepare(chat_target, [src], str(tmp_path / "out"), progress=False)
    assert stats["num_rows_written"] == 1 and stats["num_bad_rows"] == 0
    [(ids, mask)] = read_rows(tmp_path / "out")
    assert len(ids) == len(mask)
    supervised = tok.convert_ids_to_tokens([i for i, m in zip(ids, mask) if m])
    # each assistant turn: its content and its end-of-turn marker, nothing of the user/system/role headers
    assert supervised == ["one", "two", "three", ".", "<|im_end|>", "one", "two", "three", "<|im_end|>"]
    first_assistant = tok.convert_tokens_to_ids("assistant")
    assert mask[ids.index(first_assistant)] == 0
    TokenizedDataset(str(tmp_path / "out"), max_seq_len=256)  # the trainer reads it


def test_bad_rows_are_counted_by_reason(chat_target, tmp_path, capsys):
    good = synthetic_chats(5, seed=1)
    rows = good + [
        "{not json",
        {"messages": [{"role": "user", "content": "hello"}]},                           # no assistant
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]},
        {"messages": [{"role": "user", "content": "one " * 300}, {"role": "assistant", "content": "ok"}]},
        {"text": "no messages field"},
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    assert main(["--target-model", chat_target, "--input", src, "--out-dir", str(out), "--max-seq-len", "128",
                 "--rows-per-shard", "4", "--no-progress"]) == 0
    stats = json.load(open(out / "stats.json"))
    assert stats["num_rows_written"] == 5
    assert stats["bad"] == {"bad_json": 1, "no_assistant_turn": 1, "empty_assistant": 1, "too_long": 1,
                            "no_messages": 1}
    assert stats["num_input_rows"] == 10 and stats["complete"]
    printed = capsys.readouterr().out
    assert "5 refused" in printed and "too_long 1" in printed


def test_regenerate_uses_the_targets_own_tokens_and_resumes(chat_target, tmp_path):
    rows = synthetic_chats(9, seed=2)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = str(tmp_path / "regen")
    kw = dict(regenerate=True, temperature=0.7, max_new_tokens=12, batch_size=4, rows_per_shard=3,
              engine="transformers", device="cpu", max_seq_len=128, progress=False)
    first = prepare(chat_target, [src], out, num_rows=6, **kw)           # stop after 2 of 3 chunks
    assert first["next_row"] == 6 and first["num_shards"] == 2
    shard0 = open(os.path.join(out, "shard-00000.parquet"), "rb").read()
    stats = prepare(chat_target, [src], out, **kw)                       # resumes at row 6
    assert stats["next_row"] == 9 and stats["complete"]
    assert open(os.path.join(out, "shard-00000.parquet"), "rb").read() == shard0  # not redone
    got = read_rows(out)
    assert len(got) + stats["num_bad_rows"] == 9
    for ids, mask in got:
        n_prompt = mask.index(1)
        assert all(m == 0 for m in mask[:n_prompt]) and all(m == 1 for m in mask[n_prompt:])
        assert 1 <= len(ids) - n_prompt <= 12
    # a rerun with other settings is refused instead of mixing data
    with pytest.raises(ValueError, match="other settings"):
        prepare(chat_target, [src], out, **{**kw, "temperature": 0.5})
    # ... and so is the same path with edited content (the shards were made from the old prompts)
    write_jsonl(tmp_path / "in.jsonl", synthetic_chats(9, seed=3))
    with pytest.raises(ValueError, match="other settings"):
        prepare(chat_target, [src], out, **kw)


def test_regenerate_answers_the_last_user_turn_of_a_multi_turn_row_in_its_context(chat_target, tmp_path):
    from transformers import AutoTokenizer
    turns = [{"role": "user", "content": "count from one to three"}, {"role": "assistant", "content": "one two three"},
             {"role": "user", "content": "again please"}]
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": turns}, {"messages": turns[:2]}])
    out = str(tmp_path / "regen")
    stats = prepare(chat_target, [src], out, regenerate=True, temperature=0.0, max_new_tokens=6, batch_size=2,
                    engine="transformers", device="cpu", max_seq_len=128, progress=False)
    assert stats["num_rows_written"] == 2
    tok = AutoTokenizer.from_pretrained(chat_target)
    whole, first = (tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
                    for m in (turns, turns[:1]))
    (ids_a, mask_a), (ids_b, mask_b) = read_rows(out)
    # the multi-turn row: all three turns are the prompt (unsupervised), the answer to the last one is supervised
    n = mask_a.index(1)
    assert ids_a[:n] == tok(whole, add_special_tokens=False)["input_ids"] and all(mask_a[n:])
    # a row that ends with an assistant turn is answered after its first user turn, as before
    assert ids_b[:mask_b.index(1)] == tok(first, add_special_tokens=False)["input_ids"]


def test_regenerated_greedy_rows_equal_the_targets_greedy_decode(chat_target, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_trainer.eval.spec_decode import reference_greedy
    rows = synthetic_chats(2, seed=3)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = str(tmp_path / "greedy")
    prepare(chat_target, [src], out, regenerate=True, temperature=0.0, max_new_tokens=10, batch_size=2,
            engine="transformers", device="cpu", progress=False)
    tok = AutoTokenizer.from_pretrained(chat_target)
    model = AutoModelForCausalLM.from_pretrained(chat_target, dtype=torch.float32)
    for ids, mask in read_rows(out):
        n_prompt = mask.index(1)
        ref = reference_greedy(model, ids[:n_prompt], 10, eos_ids={tok.eos_token_id})
        assert ids[n_prompt:] == ref.tokens


def test_held_out_prompts_are_refused_from_training_data(chat_target, tmp_path, capsys):
    from dflash_trainer.prep.heldout import OTHER_STYLES, load_prompts
    other = load_prompts(OTHER_STYLES)
    long_one = next(p for p in other if len(p.split()) >= 12)
    reply = {"role": "assistant", "content": "ok"}
    rows = synthetic_chats(3, seed=4) + [
        {"messages": [{"role": "user", "content": other[0]}, reply]},                            # one as it is
        {"messages": [{"role": "system", "content": "be brief"},                                 # 8 of its words,
                      {"role": "user", "content": "hi . " + " ".join(long_one.split()[3:11]) + " ?"}, reply]},  # inside
        {"messages": [{"role": "user", "content": "count from one to three"}, reply]},           # not held out
    ]
    mine = write_jsonl(tmp_path / "mine.jsonl", [{"prompt": "say red green blue again"}])  # a held-out file of one's own
    rows.append({"messages": [{"role": "user", "content": "please say red green blue again"}, reply]})
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    assert main(["--target-model", chat_target, "--input", src, "--out-dir", str(out), "--held-out", mine,
                 "--no-progress"]) == 0
    stats = json.load(open(out / "stats.json"))
    assert stats["bad"] == {"held_out": 3} and stats["num_rows_written"] == 4
    assert "held_out 3" in capsys.readouterr().out
    # without the file of one's own, only the other-styles set is held out; a missing file is named before
    # anything is written
    assert prepare(chat_target, [src], str(tmp_path / "out2"), progress=False)["bad"] == {"held_out": 2}
    assert main(["--target-model", chat_target, "--input", src, "--out-dir", str(tmp_path / "out3"),
                 "--held-out", str(tmp_path / "none.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none.jsonl: no such file" in err
    assert not os.path.exists(tmp_path / "out3")


def test_the_regeneration_levers_are_declared_once_and_the_cap_reaches_the_data(chat_target, tmp_path, capsys):
    from dflash_trainer.prep import prepare_data
    from trainer_testlib import load_benchmark
    proof = load_benchmark("proofs.proof_smollm2")
    mine, theirs = ({a.dest: a for a in p._actions} for p in (prepare_data.build_parser(), proof.build_parser()))
    d = prepare_data.prepare_defaults()
    proofs_own = {"regen_max_new_tokens": 384, "regen_batch_size": 512, "regen_rows_per_shard": 512}
    for name, kind, _ in prepare_data.REGENERATION_FLAGS:
        dest = name if name == "temperature" else f"regen_{name}"
        assert mine[name].type is theirs[dest].type is kind and mine[name].help == theirs[dest].help
        assert mine[name].default == d[name] and theirs[dest].default == proofs_own.get(dest, d[name])
    # a bad lever is refused in one line naming the flag as each command spells it
    assert main(["--target-model", chat_target, "--input", "x.jsonl", "--out-dir", str(tmp_path / "o"),
                 "--max-new-tokens", "0"]) == 2
    assert capsys.readouterr().err.strip() == "dflash-prepare-data: error: --max-new-tokens must be at least 1"
    with pytest.raises(SystemExit):
        proof.main(["--target-model", chat_target, "--prompts", "x.jsonl", "--out", str(tmp_path / "p"),
                    "--time-budget-min", "1", "--regen-max-new-tokens", "0"])
    assert capsys.readouterr().err.strip().endswith("error: --regen-max-new-tokens must be at least 1")
    assert not os.path.exists(tmp_path / "o") and not os.path.exists(tmp_path / "p")
    # the response cap: no regenerated answer is longer, and the ones cut there are counted
    src = write_jsonl(tmp_path / "in.jsonl", synthetic_chats(6, seed=5))
    out = tmp_path / "capped"
    assert main(["--target-model", chat_target, "--input", src, "--out-dir", str(out), "--regenerate",
                 "--max-new-tokens", "3", "--temperature", "0", "--device", "cpu", "--engine", "transformers",
                 "--no-progress"]) == 0
    rows = read_rows(out)
    assert rows and all(sum(mask) <= 3 for _, mask in rows)
    stats = json.load(open(out / "stats.json"))
    assert stats["num_truncated_generations"] == sum(sum(mask) == 3 for _, mask in rows) > 0


def test_the_decoding_options_are_declared_once_and_change_no_answer_or_fingerprint(chat_target, tmp_path, capsys):
    from dflash_trainer.prep import generate, prepare_data, synthesize
    from trainer_testlib import load_benchmark
    proof = load_benchmark("proofs.proof_smollm2")
    d = generate.decoding_defaults()
    assert d == {"cache": "dynamic", "attention": "packed-gqa"}
    for prefix, parser in (("", prepare_data.build_parser()), ("", synthesize.build_parser()),
                           ("regen-", proof.build_parser())):
        actions = {a.dest: a for a in parser._actions}
        for name, flag, choices, _ in generate.DECODING_FLAGS:
            action = actions[f"{prefix}{flag}".replace("-", "_")]
            assert tuple(action.choices) == choices and action.default == d[name]
    # greedy rows through the static cache and the packed attention are the default's, and a preparation made one
    # way resumes the other (the options are not in its fingerprint)
    src = write_jsonl(tmp_path / "in.jsonl", synthetic_chats(6, seed=4))
    argv = ["--target-model", chat_target, "--input", src, "--regenerate", "--max-new-tokens", "6", "--temperature",
            "0", "--device", "cpu", "--engine", "transformers", "--no-progress", "--rows-per-shard", "3"]
    assert main(argv + ["--out-dir", str(tmp_path / "default")]) == 0
    assert "with transformers, KV cache dynamic, attention packed-gqa," in capsys.readouterr().out
    assert main(argv + ["--out-dir", str(tmp_path / "other"), "--kv-cache", "static",
                        "--decode-attention", "sdpa", "--num-rows", "3"]) == 0
    assert "with transformers, KV cache static, attention sdpa," in capsys.readouterr().out
    assert main(argv + ["--out-dir", str(tmp_path / "other")]) == 0  # resumes at row 3
    assert "resuming at row 3" in capsys.readouterr().out
    assert read_rows(tmp_path / "other") == read_rows(tmp_path / "default")
    with pytest.raises(SystemExit):  # argparse refuses a choice it does not know, before anything is written
        main(argv + ["--out-dir", str(tmp_path / "bad"), "--kv-cache", "paged"])
    assert "invalid choice: 'paged'" in capsys.readouterr().err and not os.path.exists(tmp_path / "bad")


def test_decoding_options_with_vllm_importable_are_refused_before_it_loads(tmp_path, monkeypatch):
    """vllm cannot run here: an empty module of that name stands in for an importable one (its LLM is never
    reached), and the options that only transformers' decoding has are refused first."""
    import sys
    import types

    from dflash_trainer.prep.generate import Generator
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    tok = types.SimpleNamespace(pad_token_id=0, eos_token_id=1)
    with pytest.raises(ValueError, match="choose transformers' decoding, and vllm is importable: add --engine"):
        Generator(str(tmp_path), tok, "auto", "cpu", 0.0, 4, 2, 0, cache="static")
