"""dflash-prepare-data: chat data in the shapes people have -> tokenized-completion parquet shards for dflash-train.

Input (--input, repeatable): local files (.json, .jsonl, .parquet, .arrow) or folders of shards (a dataset
repository's checkout), read with the `datasets` library (sources.py: --split, --shuffle with --seed,
--num-rows). Rows in any of these shapes (formats.py), detected from the columns or named with --format:
ShareGPT {"conversations": [{"from", "value"}]}, OpenAI {"messages": [{"role", "content"}]}, Alpaca
{"instruction", "input", "output"}, {"prompt", "completion"}, plain {"text"}; multi-turn conversations and system
prompts are kept. Output: --out-dir/shard-NNNNN.parquet with input_ids list<int32> and loss_mask list<int8> (the
format data.py reads), progress.json (resume point) and stats.json (rows kept, rows refused by reason).

    dflash-prepare-data --target-model TARGET_DIR --input chats.jsonl --out-dir data/tok
    dflash-prepare-data --target-model TARGET_DIR --input ultrachat/ --split train_sft --shuffle --num-rows 50000 \
        --out-dir data/regen --regenerate --temperature 0.7 --max-new-tokens 512 --batch-size 256

Tokenization uses the target's tokenizer and chat template. loss_mask is 1 on assistant tokens: each
assistant turn's text as the template renders it (content and end-of-turn marker), found by rendering
the conversation up to that turn with and without the generation prompt. Plain text: every token (no template).

--regenerate (docs/dflash.md "Data": the drafter must imitate the target): each row's prompt (the messages
before the first assistant turn, or all of a conversation that ends with a user turn; for plain text its first
half) is answered by the target itself (vLLM when importable and --engine allows, else transformers generate,
batched, left padding). The row is then the prompt
ids plus the generated ids exactly as generated (not re-tokenized text), loss_mask 1 on the generated ids.

Held-out prompts are never trained on: a row whose text shares a run of 8 words with a held-out prompt, or
contains a shorter one whole, is refused (reason held_out; heldout.py). The held-out prompts are the trainer's
other-styles set (prep/other_styles.jsonl, on which the proof measures τ) plus any --held-out file.

Resumable: input rows are processed in chunks of --rows-per-shard; each chunk becomes one shard,
written atomically, then progress.json records the next input row. A rerun with the same flags skips
what is done. Refused rows are counted by reason and printed at the end, never dropped silently.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import sys
import time
from collections import Counter

from dflash_trainer.telemetry.heartbeat import write_json_atomic

from .chat_tokens import example_prompt, example_tokens
from .formats import FORMATS, BadRow, detect_format, to_example
from .generate import Generator, add_decoding_flags, decoding_of
from .heldout import OTHER_STYLES, HeldOut
from .sources import DEFAULT_SPLIT, file_sha256, fingerprint_of, load_rows

PROG = "dflash-prepare-data"


def write_shard(out_dir: str, shard: int, rows: list[tuple[list[int], list[int]]]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))])
    table = pa.table({"input_ids": [r[0] for r in rows], "loss_mask": [r[1] for r in rows]}, schema=schema)
    path = os.path.join(out_dir, f"shard-{shard:05d}.parquet")
    pq.write_table(table, path + ".tmp")
    os.replace(path + ".tmp", path)  # a killed run never leaves a half shard under the real name
    return path


class _Progress:
    def __init__(self, total: int, done: int):
        self.bar = None
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=done, unit="row", desc=PROG)
        except ImportError:
            self.total, self.done, self.t0 = total, done, time.time()

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)
        else:
            self.done += n
            print(f"{PROG}: {self.done}/{self.total} rows ({time.time() - self.t0:.0f} s)", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _settings(target_model: str, inputs: list[str], fmt: str, split: str, shuffle: bool, held_out: tuple[str, ...],
              **kw) -> dict:
    """What a resume must match. Keys beyond the first version's appear only when not at their defaults, so
    preparations of chat JSONL made before stay resumable."""
    settings = {"target_model": os.path.abspath(target_model), **fingerprint_of(inputs), **kw}
    extra = {"format": fmt if fmt != "messages" else None, "split": split if split != DEFAULT_SPLIT else None,
             "shuffle": shuffle or None,
             # the --held-out files (the other-styles set is not recorded: data prepared before it was shipped
             # stays resumable, and the proof's sources are checked disjoint from it by its test)
             "held_out": [[os.path.abspath(p), file_sha256(p)] for p in held_out] or None}
    return settings | {k: v for k, v in extra.items() if v is not None}


def _open_state(out_dir: str, settings: dict) -> dict:
    fingerprint = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    os.makedirs(out_dir, exist_ok=True)
    state = {"fingerprint": fingerprint, "settings": settings, "next_row": 0, "num_shards": 0,
             "num_rows_written": 0, "num_tokens": 0, "num_supervised_tokens": 0, "bad": {},
             "num_truncated_generations": 0}
    path = os.path.join(out_dir, "progress.json")
    if os.path.isfile(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("fingerprint") != fingerprint:
            raise ValueError(f"--out-dir {out_dir} holds a preparation with other settings; use a new --out-dir "
                             "or delete it to start over")
        state = old
    return state


def _examples(fmt: str, chunk: list, bad: Counter, held_out: HeldOut) -> list:
    out = []
    for row in chunk:
        try:
            example = to_example(fmt, row)
            text = example if isinstance(example, str) else "\n".join(m["content"] for m in example)
            if held_out.overlap(text) is not None:
                raise BadRow("held_out")
            out.append(example)
        except BadRow as e:
            bad[str(e)] += 1
    return out


def _tokenized(tokenizer, examples: list, max_seq_len: int, bad: Counter) -> list[tuple[list[int], list[int]]]:
    rows = []
    for ex in examples:
        try:
            rows.append(example_tokens(tokenizer, ex, max_seq_len))
        except BadRow as e:
            bad[str(e)] += 1
    return rows


def _regenerated(tokenizer, gen, examples: list, max_seq_len: int, max_new_tokens: int, chunk_seed: int,
                 bad: Counter, state: dict) -> list[tuple[list[int], list[int]]]:
    prompts, limits = [], []
    for ex in examples:
        try:
            p = example_prompt(tokenizer, ex, max_seq_len)
        except BadRow as e:
            bad[str(e)] += 1
            continue
        prompts.append(p)
        limits.append(min(max_new_tokens, max_seq_len - len(p)))
    outs = gen.generate(prompts, limits, chunk_seed) if prompts else []
    rows = []
    for p, g in zip(prompts, outs):
        if not g or (len(g) == 1 and g[0] in gen.eos):
            bad["empty_response"] += 1
            continue
        if g[-1] not in gen.eos:
            state["num_truncated_generations"] += 1
        rows.append((p + g, [0] * len(p) + [1] * len(g)))
    return rows


def _write_stats(out_dir: str, state: dict, total: int, bad: Counter) -> dict:
    stats = {k: state[k] for k in ("next_row", "num_shards", "num_rows_written", "num_tokens",
                                   "num_supervised_tokens", "num_truncated_generations")}
    stats.update({"format": state["format"], "num_input_rows": total, "num_bad_rows": sum(bad.values()),
                  "bad": dict(bad), "complete": state["next_row"] >= total})
    stats_path = os.path.join(out_dir, "stats.json")
    old_stats = None
    if os.path.isfile(stats_path):
        with open(stats_path) as f:
            old_stats = json.load(f)
    if old_stats != stats:  # a finished preparation, resumed, stays untouched
        write_json_atomic(stats_path, stats, indent=2)
    return stats


def _tokenizer(target_model: str, fmt: str):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(target_model)
    if fmt != "text" and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"the tokenizer in {target_model} has no chat template; add one (tokenizer_config.json) "
                         "or prepare plain text (--format text)")
    return tokenizer


def prepare(target_model: str, inputs: list[str], out_dir: str, *, max_seq_len: int = 4096,
            rows_per_shard: int = 1000, regenerate: bool = False, temperature: float = 0.7,
            max_new_tokens: int = 512, batch_size: int = 64, engine: str = "auto", device: str = "auto",
            seed: int = 0, num_rows: int | None = None, time_budget_s: float | None = None,
            progress: bool = True, fmt: str = "auto", split: str = DEFAULT_SPLIT, shuffle: bool = False,
            held_out: tuple[str, ...] = (), decoding: dict | None = None) -> dict:
    """Runs (or resumes) a preparation; returns the stats dict also written to stats.json. `held_out`: prompt
    files whose prompts no row may overlap, beside the other-styles set (always held out). `decoding`: the
    Generator's decoding options (generate.DECODING_FLAGS; its defaults where absent)."""
    held_out = tuple(p for p in held_out if os.path.abspath(p) != OTHER_STYLES)  # held out anyway, not recorded
    guard = HeldOut.from_files([OTHER_STYLES, *held_out])  # a bad --held-out file fails before anything is written
    # datasets' arrow copy of the input lives in the out dir for this run only (not in the user's cache)
    cache = os.path.join(out_dir, ".datasets-cache")
    shutil.rmtree(cache, ignore_errors=True)
    try:
        source = load_rows(inputs, split=split, num_rows=num_rows, shuffle=shuffle, seed=seed, cache_dir=cache)
        return _run(source, target_model, inputs, out_dir, fmt, split, shuffle, guard, held_out,
                    max_seq_len=max_seq_len, rows_per_shard=rows_per_shard, regenerate=regenerate, temperature=temperature,
                    max_new_tokens=max_new_tokens, batch_size=batch_size, engine=engine, device=device, seed=seed,
                    time_budget_s=time_budget_s, progress=progress, decoding=decoding or {})
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _run(source, target_model: str, inputs: list[str], out_dir: str, fmt: str, split: str, shuffle: bool,
         guard: HeldOut, held_out: tuple[str, ...], *,
         max_seq_len: int, rows_per_shard: int, regenerate: bool, temperature: float, max_new_tokens: int,
         batch_size: int, engine: str, device: str, seed: int, time_budget_s: float | None, progress: bool,
         decoding: dict) -> dict:
    fmt = detect_format(source.columns) if fmt == "auto" else fmt
    tokenizer = _tokenizer(target_model, fmt)
    settings = _settings(target_model, inputs, fmt, split, shuffle, held_out, max_seq_len=max_seq_len,
                         rows_per_shard=rows_per_shard, regenerate=regenerate, temperature=temperature,
                         max_new_tokens=max_new_tokens, seed=seed)
    state = _open_state(out_dir, settings)
    state["format"] = fmt
    total, bad, gen = len(source), Counter(state["bad"]), None
    if regenerate and state["next_row"] < total:
        gen = Generator(target_model, tokenizer, engine, device, temperature, max_new_tokens, batch_size, seed,
                        **decoding)
        print(f"{PROG}: regenerating with {gen.describe()}, temperature {temperature}, <= {max_new_tokens} new "
              f"tokens, batch {batch_size}", flush=True)
    print(f"{PROG}: {total} rows, format {fmt}" + (f", resuming at row {state['next_row']}" if state["next_row"]
                                                   else ""), flush=True)
    bar = _Progress(total, state["next_row"]) if progress else None
    t0 = time.time()
    while state["next_row"] < total:
        if time_budget_s is not None and time.time() - t0 > time_budget_s:
            print(f"{PROG}: time budget {time_budget_s:.0f} s reached at row {state['next_row']}; rerun to resume",
                  flush=True)
            break
        start = state["next_row"]
        chunk = source.rows(start, min(start + rows_per_shard, total))
        examples = _examples(fmt, chunk, bad, guard)
        rows = (_regenerated(tokenizer, gen, examples, max_seq_len, max_new_tokens, seed * 1_000_003 + start, bad,
                             state) if regenerate else _tokenized(tokenizer, examples, max_seq_len, bad))
        if rows:
            write_shard(out_dir, state["num_shards"], rows)
            state["num_shards"] += 1
        state["next_row"] = start + len(chunk)
        state["num_rows_written"] += len(rows)
        state["num_tokens"] += sum(len(r[0]) for r in rows)
        state["num_supervised_tokens"] += sum(sum(r[1]) for r in rows)
        state["bad"] = dict(bad)
        # after the shard: a crash in between redoes one chunk at most
        write_json_atomic(os.path.join(out_dir, "progress.json"), state, indent=2)
        if bar:
            bar.update(len(chunk))
    if bar:
        bar.close()
    return _write_stats(out_dir, state, total, bad)


def prepare_defaults() -> dict:
    """prepare()'s keyword defaults: each default declared once, in its signature."""
    return {k: v.default for k, v in inspect.signature(prepare).parameters.items()}


# The regeneration levers as flags, declared once: (prepare()'s parameter, type, help). dflash-prepare-data takes
# them under these names; the proof driver with --regen- in front (--temperature as it is).
REGENERATION_FLAGS = (
    ("temperature", float, "sampling temperature of the regeneration (0 = greedy)"),
    ("max_new_tokens", int, "the response cap: a regenerated answer stops after this many tokens (kept, counted as "
                            "num_truncated_generations)"),
    ("batch_size", int, "prompts per generate call (transformers)"),
    ("rows_per_shard", int, "input rows per shard (and per resume unit)"),
)


def _regeneration_flag(name: str, prefix: str) -> str:
    return "--" + ("" if name == "temperature" else prefix) + name.replace("_", "-")


def add_regeneration_flags(p, prefix: str = "") -> None:
    """REGENERATION_FLAGS on parser `p`, with prepare()'s defaults; `prefix` goes before every name but
    --temperature's (dest: the name with it, e.g. regen_max_new_tokens). A tool with other defaults says so with
    p.set_defaults, in the open."""
    d = prepare_defaults()
    for name, kind, text in REGENERATION_FLAGS:
        p.add_argument(_regeneration_flag(name, prefix), type=kind, default=d[name],
                       help=f"{text} (default %(default)s)")


def check_regeneration(args, prefix: str = "") -> None:
    """The regeneration flags' bounds (temperature >= 0, the others >= 1): a one-line ValueError naming the flag
    as `args` (parsed by add_regeneration_flags with this prefix) spells it."""
    for name, _, _ in REGENERATION_FLAGS:
        flag = _regeneration_flag(name, prefix)
        low = 0 if name == "temperature" else 1
        if getattr(args, flag[2:].replace("-", "_")) < low:
            raise ValueError(f"{flag} must be at least {low}")


def build_parser() -> argparse.ArgumentParser:
    d = prepare_defaults()
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target-model", required=True,
                   help="target dir (tokenizer + chat template; weights if --regenerate)")
    p.add_argument("--input", action="append", required=True,
                   help="a .json/.jsonl/.parquet/.arrow file or a folder of them (repeatable)")
    p.add_argument("--format", default=d["fmt"], choices=["auto", *FORMATS],
                   help="the rows' shape; auto: from the columns (see above)")
    p.add_argument("--split", default=d["split"], help="the split to read (a folder's splits come from file names)")
    p.add_argument("--num-rows", type=int, default=d["num_rows"], help="use only the first N rows (after --shuffle)")
    p.add_argument("--shuffle", action="store_true", help="shuffle the rows with --seed before --num-rows")
    p.add_argument("--out-dir", required=True, help="parquet shards, progress.json and stats.json go here")
    p.add_argument("--max-seq-len", type=int, default=d["max_seq_len"],
                   help="longer rows are refused (reason too_long)")
    p.add_argument("--regenerate", action="store_true", help="answer each prompt with the target itself")
    add_regeneration_flags(p)
    add_decoding_flags(p)
    p.add_argument("--engine", default=d["engine"], choices=["auto", "vllm", "transformers"])
    p.add_argument("--device", default=d["device"], choices=["auto", "cpu", "cuda"])
    p.add_argument("--seed", type=int, default=d["seed"], help="sampling seed, and the shuffle's")
    p.add_argument("--held-out", action="append", default=list(d["held_out"]), metavar="FILE",
                   help="a JSONL of held-out prompts (repeatable): rows that overlap one are refused (reason held_out); "
                        f"the other-styles set ({os.path.basename(OTHER_STYLES)}) always is")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.max_seq_len < 2:
            raise ValueError("--max-seq-len must be at least 2")
        check_regeneration(args)
        if args.num_rows is not None and args.num_rows < 1:
            raise ValueError("--num-rows must be at least 1")
        stats = prepare(args.target_model, args.input, args.out_dir, max_seq_len=args.max_seq_len,
                        rows_per_shard=args.rows_per_shard, regenerate=args.regenerate,
                        temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size, engine=args.engine, device=args.device, seed=args.seed,
                        num_rows=args.num_rows, progress=not args.no_progress, fmt=args.format, split=args.split,
                        shuffle=args.shuffle, held_out=tuple(args.held_out), decoding=decoding_of(args))
    except (ValueError, OSError) as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"{PROG}: {stats['format']}: {stats['num_rows_written']} rows kept in {stats['num_shards']} shards "
          f"({stats['num_tokens']} tokens, {stats['num_supervised_tokens']} supervised); "
          f"{stats['num_bad_rows']} refused: " + (", ".join(f"{k} {v}" for k, v in sorted(stats["bad"].items()))
                                                  or "none"))
    if stats["num_truncated_generations"]:
        print(f"{PROG}: note: {stats['num_truncated_generations']} generations hit --max-new-tokens (kept, no EOS)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
