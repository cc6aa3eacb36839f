"""dflash-prepare-data on data in the shapes people have (issue 32): ShareGPT, OpenAI messages, Alpaca,
prompt/completion and plain text, as JSONL, JSON, parquet, arrow files and a folder of split shards, read through
the `datasets` library. Small files the tests write (no hub access), the tiny target with the tiny ChatML
tokenizer; then the prepared data of every format trains a few steps and exports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dflash_trainer.prep.prepare_data import main, prepare

from test_prepare_data import no_hub, read_rows  # noqa: F401 - fixtures
from trainer_testlib import train_cmd

SYSTEM = "you are a helpful tiny model"
# (user, assistant) turns every format carries; two turns where the format has more than one
TURNS = [("please count from one to three", "one two three ."), ("again", "one two three")]


def _sharegpt(i):
    conv = [{"from": "system", "value": SYSTEM}]
    for user, answer in TURNS:
        conv += [{"from": "human", "value": user}, {"from": "gpt", "value": answer}]
    return {"id": str(i), "conversations": conv}


def _messages(i):
    msgs = []
    for user, answer in TURNS:  # OpenAI content parts on the user turns
        msgs += [{"role": "user", "content": [{"type": "text", "text": user}]},
                 {"role": "assistant", "content": answer}]
    return {"system": SYSTEM, "messages": msgs}


def _alpaca(i):
    return {"instruction": "please count", "input": "from one to three", "output": TURNS[0][1]}


def _prompt_completion(i):
    return {"prompt": TURNS[0][0], "completion": TURNS[0][1]}


def _text(i):
    return {"text": "one two three four five six seven eight nine ten"}


# format -> (row maker, file kind, assistant tokens the loss mask must cover, in order)
FORMATS = {
    "sharegpt": (_sharegpt, "parquet", "one two three . <|im_end|> one two three <|im_end|>"),
    "messages": (_messages, "jsonl", "one two three . <|im_end|> one two three <|im_end|>"),
    "alpaca": (_alpaca, "arrow", "one two three . <|im_end|>"),
    "prompt_completion": (_prompt_completion, "json", "one two three . <|im_end|>"),
    "text": (_text, "folder", "one two three four five six seven eight nine ten"),
}


def write_rows(path, rows, kind):
    """rows as a file of `kind` (jsonl, json, parquet, arrow) or a folder of two jsonl shards; returns the input."""
    if kind == "jsonl":
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    elif kind == "json":
        with open(path, "w") as f:
            json.dump(rows, f)
    elif kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif kind == "arrow":
        table = pa.Table.from_pylist(rows)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    else:
        os.makedirs(path)
        half = len(rows) // 2
        write_rows(os.path.join(path, "part-0.jsonl"), rows[:half], "jsonl")
        write_rows(os.path.join(path, "part-1.jsonl"), rows[half:], "jsonl")
    return str(path)


def _input(tmp_path, fmt, n=4):
    make, kind, _ = FORMATS[fmt]
    name = f"{fmt}" if kind == "folder" else f"{fmt}.{kind}"
    return write_rows(tmp_path / name, [make(i) for i in range(n)], kind)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_is_detected_and_masked_on_the_assistant_turns(fmt, chat_target, tmp_path, capsys):
    from transformers import AutoTokenizer
    src, out = _input(tmp_path, fmt), tmp_path / "out"
    assert main(["--target-model", chat_target, "--input", src, "--out-dir", str(out)]) == 0
    printed = capsys.readouterr()
    assert f"{fmt}: 4 rows kept" in printed.out and "refused: none" in printed.out
    assert "4/4" in printed.err  # the progress bar
    stats = json.load(open(out / "stats.json"))
    assert stats["format"] == fmt and stats["num_rows_written"] == 4
    assert not os.path.exists(out / ".datasets-cache")  # datasets' copy of the input is gone with the run
    tok = AutoTokenizer.from_pretrained(chat_target)
    for ids, mask in read_rows(out):
        supervised = tok.convert_ids_to_tokens([i for i, m in zip(ids, mask) if m])
        assert " ".join(supervised) == FORMATS[fmt][2]
        text = tok.decode(ids)
        if fmt in ("sharegpt", "messages"):  # system prompt and both turns kept, in order
            assert text.index(SYSTEM) < text.index("count") < text.index("again")
        if fmt == "alpaca":
            assert "user please count from one to three <|im_end|>" in text  # instruction, then input


def test_format_flag_names_the_shape_and_unknown_columns_are_refused(chat_target, tmp_path, capsys):
    rows = [{"question": "please count from one to three", "answer": "one two three ."}]
    src = write_rows(tmp_path / "qa.jsonl", rows, "jsonl")
    assert main(["--target-model", chat_target, "--input", src, "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "question" in err[0] and "--format" in err[0]
    # columns of two shapes: --format picks the one meant
    both = [{"text": "one two three four", **_prompt_completion(0)} for _ in range(2)]
    src = write_rows(tmp_path / "both.jsonl", both, "jsonl")
    assert prepare(chat_target, [src], str(tmp_path / "auto"), progress=False)["format"] == "prompt_completion"
    named = prepare(chat_target, [src], str(tmp_path / "named"), progress=False, fmt="text")
    assert named["format"] == "text" and named["num_supervised_tokens"] == 2 * 4


def test_split_shuffle_and_num_rows(chat_target, tmp_path):
    """A dataset folder's splits come from its file names; the shuffle is seeded; --num-rows cuts after it."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(chat_target)
    words = "one two three four five six seven eight nine ten eleven twelve".split()
    folder = tmp_path / "repo" / "data"
    os.makedirs(folder)
    pq.write_table(pa.Table.from_pylist([{"text": f"{w} {w} red"} for w in words]),
                   folder / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist([{"text": f"{w} {w} blue"} for w in words[:3]]),
                   folder / "test-00000-of-00001.parquet")
    (tmp_path / "repo" / "README.md").write_text("# a dataset card\n")

    def firsts(out, **kw):
        stats = prepare(chat_target, [str(tmp_path / "repo")], str(tmp_path / out), progress=False, **kw)
        return stats, [tok.convert_ids_to_tokens(ids) for ids, _ in read_rows(tmp_path / out)]

    stats, rows = firsts("test", split="test")
    assert stats["num_rows_written"] == 3 and all(r[-1] == "blue" for r in rows)
    _, plain = firsts("plain")
    assert [r[0] for r in plain] == words
    _, a = firsts("a", shuffle=True, seed=1, num_rows=5)
    _, b = firsts("b", shuffle=True, seed=1, num_rows=5)
    _, c = firsts("c", shuffle=True, seed=2, num_rows=5)
    assert a == b and len(a) == 5 and a != c and [r[0] for r in a] != words[:5]
    with pytest.raises(ValueError, match="--split validation"):
        firsts("none", split="validation")


def test_a_folder_saved_by_datasets_is_read_by_split(chat_target, tmp_path):
    import datasets
    splits = {"train": [_alpaca(i) for i in range(3)], "test": [_prompt_completion(0)]}
    datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()}).save_to_disk(
        str(tmp_path / "saved"))
    stats = prepare(chat_target, [str(tmp_path / "saved")], str(tmp_path / "out"), progress=False, split="test")
    assert stats["format"] == "prompt_completion" and stats["num_rows_written"] == 1
    stats = prepare(chat_target, [str(tmp_path / "saved")], str(tmp_path / "train"), progress=False)
    assert stats["format"] == "alpaca" and stats["num_rows_written"] == 3
    with pytest.raises(ValueError, match="holds the splits train, test"):
        prepare(chat_target, [str(tmp_path / "saved")], str(tmp_path / "x"), progress=False, split="dev")


def test_bad_rows_of_every_shape_are_skipped_and_counted(chat_target, tmp_path):
    rows = [_sharegpt(0),
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "robot", "value": "ok"}]},
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": " "}]},
            {"conversations": "not a list"},
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ["x"]}]}]
    stats = prepare(chat_target, [write_rows(tmp_path / "s.jsonl", rows, "jsonl")], str(tmp_path / "s"),
                    progress=False)
    assert stats["num_rows_written"] == 1 and stats["complete"]
    assert stats["bad"] == {"unknown_role": 1, "empty_assistant": 1, "no_conversations": 1, "bad_content": 1}
    rows = [_alpaca(0), {"instruction": "please count", "input": "", "output": None},
            {"instruction": "one " * 200, "input": "", "output": "ok"}]
    stats = prepare(chat_target, [write_rows(tmp_path / "a.parquet", rows, "parquet")], str(tmp_path / "a"),
                    progress=False, max_seq_len=64)
    assert stats["num_rows_written"] == 1 and stats["bad"] == {"no_instruction_output": 1, "too_long": 1}


@pytest.mark.parametrize("fmt", FORMATS)
def test_regenerate_answers_every_format_with_the_target(fmt, chat_target, tmp_path):
    from transformers import AutoTokenizer
    src = _input(tmp_path, fmt, n=2)
    stats = prepare(chat_target, [src], str(tmp_path / "regen"), regenerate=True, temperature=0.0,
                    max_new_tokens=6, batch_size=2, engine="transformers", device="cpu", progress=False)
    assert stats["num_rows_written"] + stats["num_bad_rows"] == 2 and stats["num_rows_written"] >= 1
    tok = AutoTokenizer.from_pretrained(chat_target)
    for ids, mask in read_rows(tmp_path / "regen"):
        n_prompt = mask.index(1)
        assert set(mask[:n_prompt]) == {0} and set(mask[n_prompt:]) == {1} and 1 <= len(ids) - n_prompt <= 6
        prompt = tok.decode(ids[:n_prompt])
        if fmt == "text":  # the first half of the text, continued by the target
            assert prompt == "one two three four five"
        else:  # the conversation up to its first assistant turn, ending in the generation prompt
            assert prompt.endswith("<|im_start|> assistant") and "one two three ." not in prompt
            assert (SYSTEM in prompt) == (fmt in ("sharegpt", "messages"))


@pytest.mark.slow
def test_every_format_prepares_trains_and_exports(chat_target, tmp_path):
    """Acceptance: the shards of each format together train a few steps on the tiny target, then export."""
    data = tmp_path / "data"
    os.makedirs(data)
    for fmt in FORMATS:
        out = tmp_path / f"prep-{fmt}"
        prepare(chat_target, [_input(tmp_path, fmt, n=8)], str(out), progress=False)
        for name in os.listdir(out):
            if name.endswith(".parquet"):
                shutil.copy(out / name, data / f"{fmt}-{name}")
    cmd = train_cmd({"target": chat_target, "data": str(data)}, tmp_path / "train", "--max-steps", "3",
                    "--max-seq-len", "128")
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "step 3 " in run.stdout + run.stderr
    export = subprocess.run([cmd[0], "-m", "dflash_trainer.export.exporter", "--checkpoint", str(tmp_path / "train"),
                             "--target-model", chat_target, "--out", str(tmp_path / "export")],
                            capture_output=True, text=True, timeout=120)
    assert export.returncode == 0, export.stderr
    assert {"config.json", "model.safetensors"} <= set(os.listdir(tmp_path / "export"))
