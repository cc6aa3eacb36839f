"""dflash-prepare-data: chat JSONL -> tokenized-completion parquet shards for dflash-train.

Input: JSONL files, one conversation a line: {"messages": [{"role": "user", "content": "..."}, ...]}.
Output: --out-dir/shard-NNNNN.parquet with input_ids list<int32> and loss_mask list<int8> (the format
data.py reads), progress.json (resume point) and stats.json (rows kept, rows refused by reason).

    dflash-prepare-data --target-model TARGET_DIR --input chats.jsonl --out-dir data/tok
    dflash-prepare-data --target-model TARGET_DIR --input prompts.jsonl --out-dir data/regen \
        --regenerate --temperature 0.7 --max-new-tokens 512 --batch-size 256

Tokenization uses the target's tokenizer and chat template. loss_mask is 1 on assistant tokens: each
assistant turn's text as the template renders it (content and end-of-turn marker), found by rendering
the conversation up to that turn with and without the generation prompt.

--regenerate (docs/dflash.md "Data": the drafter must imitate the target): each row's prompt (the messages
before the first assistant turn) is answered by the target itself (vLLM when importable and
--engine allows, else transformers generate, batched, left padding). The row is then the prompt ids
plus the generated ids exactly as generated (not re-tokenized text), loss_mask 1 on the generated ids.

Resumable: input rows are processed in chunks of --rows-per-shard; each chunk becomes one shard,
written atomically, then progress.json records the next input row. A rerun with the same flags skips
what is done. Refused rows are counted by reason and printed at the end, never dropped silently.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import Counter

from dflash_trainer.telemetry.heartbeat import write_json_atomic

PROG = "dflash-prepare-data"


class BadRow(Exception):
    """A row that cannot become training data; str(e) is the reason counted in stats.json."""


def read_rows(paths: list[str]):
    """(global row index, parsed object or BadRow) over all input files in order."""
    index = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    yield index, json.loads(line)
                except ValueError:
                    yield index, BadRow("bad_json")
                index += 1


def get_messages(row) -> list[dict]:
    if isinstance(row, BadRow):
        raise row
    msgs = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in msgs):
        raise BadRow("no_messages")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def render(tokenizer, messages, add_generation_prompt: bool) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # noqa: BLE001 - templates raise anything (jinja errors, role checks)
        raise BadRow("template_error") from e


def tokenize_chat(tokenizer, messages: list[dict], max_seq_len: int) -> tuple[list[int], list[int]]:
    """input_ids and loss_mask (1 on assistant tokens) for one conversation."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise BadRow("no_assistant_turn")
    if any(not messages[i]["content"].strip() for i in turns):
        raise BadRow("empty_assistant")
    full = render(tokenizer, messages, False)
    spans = []
    for i in turns:
        before = render(tokenizer, messages[:i], True)
        upto = render(tokenizer, messages[:i + 1], False)
        if not (upto.startswith(before) and full.startswith(upto)):
            raise BadRow("template_not_incremental")  # e.g. a template that rewrites earlier turns
        spans.append((len(before), len(upto)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    mask = [int(any(s <= start < e for s, e in spans)) for start, _ in enc["offset_mapping"]]
    if len(ids) > max_seq_len:
        raise BadRow("too_long")
    if sum(mask) == 0:
        raise BadRow("empty_assistant")
    return ids, mask


def prompt_ids(tokenizer, messages: list[dict], max_seq_len: int) -> list[int]:
    """The tokens the target answers under --regenerate: the messages before the first assistant turn."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    prompt = messages[:first]
    if not prompt or prompt[-1]["role"] != "user":
        raise BadRow("no_user_turn")
    ids = tokenizer(render(tokenizer, prompt, True), add_special_tokens=False)["input_ids"]
    if len(ids) >= max_seq_len:
        raise BadRow("too_long")
    return list(ids)


def eos_ids_of(model_dir: str, tokenizer) -> set[int]:
    ids = set()
    path = os.path.join(model_dir, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            eos = json.load(f).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class Generator:
    """Batched sampling from the target: vLLM when importable (and --engine allows), else transformers."""

    def __init__(self, model_dir: str, tokenizer, engine: str, device: str, temperature: float,
                 max_new_tokens: int, batch_size: int, seed: int):
        import torch
        self.tokenizer, self.temperature, self.max_new_tokens = tokenizer, temperature, max_new_tokens
        self.batch_size, self.seed = batch_size, seed
        self.eos = eos_ids_of(model_dir, tokenizer)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos or {0})
        self.vllm = None
        if engine in ("auto", "vllm"):
            try:
                import vllm  # noqa: F401
                self.vllm = vllm.LLM(model=model_dir, seed=seed)
            except ImportError:
                if engine == "vllm":
                    raise ValueError("--engine vllm but vllm is not importable; pip install vllm or use "
                                     "--engine transformers") from None
        self.engine = "vllm" if self.vllm is not None else "transformers"
        if self.vllm is None:
            from transformers import AutoModelForCausalLM

            from dflash_trainer.eval.decode_attention import use_plan_free_attention
            self.device = torch.device(device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
            use_plan_free_attention(self.device)  # generate's padded batches change shape every step
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(self.device).eval()

    def generate(self, prompts: list[list[int]], max_new: list[int], chunk_seed: int) -> list[list[int]]:
        """Generated ids per prompt, cut after the first EOS (EOS kept)."""
        if self.vllm is not None:  # not exercised by the tests (no vllm here)
            from vllm import SamplingParams
            params = [SamplingParams(temperature=self.temperature, max_tokens=m, seed=chunk_seed + i)
                      for i, m in enumerate(max_new)]
            outs = self.vllm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            return [self._cut(list(o.outputs[0].token_ids), m) for o, m in zip(outs, max_new)]
        import torch
        torch.manual_seed(chunk_seed)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths, less padding
        result: list[list[int] | None] = [None] * len(prompts)
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            width = max(len(prompts[i]) for i in idx)
            ids = torch.full((len(idx), width), self.pad, dtype=torch.long)
            att = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):  # left padding: every prompt ends where generation starts
                ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
                att[row, width - len(prompts[i]):] = 1
            limit = max(max_new[i] for i in idx)
            # pure temperature sampling (no top-k/top-p cut); greedy when --temperature 0
            sampling = dict(do_sample=True, temperature=self.temperature, top_p=1.0, top_k=0) \
                if self.temperature > 0 else dict(do_sample=False)
            with torch.no_grad():
                out = self.model.generate(input_ids=ids.to(self.device), attention_mask=att.to(self.device),
                                          max_new_tokens=limit, min_new_tokens=0, eos_token_id=sorted(self.eos) or None,
                                          pad_token_id=self.pad, **sampling)
            for row, i in enumerate(idx):
                result[i] = self._cut(out[row, width:].tolist(), max_new[i])
        return result

    def _cut(self, gen: list[int], limit: int) -> list[int]:
        gen = gen[:limit]
        for j, tok in enumerate(gen):
            if tok in self.eos:
                return gen[:j + 1]
        return gen


def write_shard(out_dir: str, shard: int, rows: list[tuple[list[int], list[int]]]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))])
    table = pa.table({"input_ids": [r[0] for r in rows], "loss_mask": [r[1] for r in rows]}, schema=schema)
    path = os.path.join(out_dir, f"shard-{shard:05d}.parquet")
    pq.write_table(table, path + ".tmp")
    os.replace(path + ".tmp", path)  # a killed run never leaves a half shard under the real name
    return path


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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


def prepare(target_model: str, inputs: list[str], out_dir: str, *, max_seq_len: int = 4096,
            rows_per_shard: int = 1000, regenerate: bool = False, temperature: float = 0.7,
            max_new_tokens: int = 512, batch_size: int = 64, engine: str = "auto", device: str = "auto",
            seed: int = 0, max_rows: int | None = None, time_budget_s: float | None = None,
            progress: bool = True) -> dict:
    """Runs (or resumes) a preparation; returns the stats dict also written to stats.json."""
    from transformers import AutoTokenizer

    for path in inputs:
        if not os.path.isfile(path):
            raise ValueError(f"--input {path} does not exist; pass JSONL files of {{\"messages\": [...]}} rows")
    tokenizer = AutoTokenizer.from_pretrained(target_model)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"the tokenizer in {target_model} has no chat template; add one (tokenizer_config.json)")
    settings = {"target_model": os.path.abspath(target_model), "inputs": [os.path.abspath(p) for p in inputs],
                "input_sha256": [_sha256(p) for p in inputs],  # edited prompts must not resume old shards
                "max_seq_len": max_seq_len, "rows_per_shard": rows_per_shard, "regenerate": regenerate,
                "temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed}
    fingerprint = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    os.makedirs(out_dir, exist_ok=True)
    progress_path = os.path.join(out_dir, "progress.json")
    state = {"fingerprint": fingerprint, "settings": settings, "next_row": 0, "num_shards": 0,
             "num_rows_written": 0, "num_tokens": 0, "num_supervised_tokens": 0, "bad": {},
             "num_truncated_generations": 0}
    if os.path.isfile(progress_path):
        with open(progress_path) as f:
            old = json.load(f)
        if old.get("fingerprint") != fingerprint:
            raise ValueError(f"--out-dir {out_dir} holds a preparation with other settings; use a new --out-dir "
                             "or delete it to start over")
        state = old
    all_rows = list(read_rows(inputs))
    total = len(all_rows) if max_rows is None else min(len(all_rows), max_rows)
    bad = Counter(state["bad"])
    gen = None
    if regenerate and state["next_row"] < total:
        gen = Generator(target_model, tokenizer, engine, device, temperature, max_new_tokens, batch_size, seed)
        print(f"{PROG}: regenerating with {gen.engine}, temperature {temperature}, <= {max_new_tokens} new tokens, "
              f"batch {batch_size}", flush=True)
    bar = _Progress(total, state["next_row"]) if progress else None
    t0 = time.time()
    while state["next_row"] < total:
        if time_budget_s is not None and time.time() - t0 > time_budget_s:
            print(f"{PROG}: time budget {time_budget_s:.0f} s reached at row {state['next_row']}; rerun to resume",
                  flush=True)
            break
        start = state["next_row"]
        chunk = all_rows[start:min(start + rows_per_shard, total)]
        rows: list[tuple[list[int], list[int]]] = []
        if regenerate:
            prompts, limits = [], []
            for _, row in chunk:
                try:
                    p = prompt_ids(tokenizer, get_messages(row), max_seq_len)
                except BadRow as e:
                    bad[str(e)] += 1
                    continue
                prompts.append(p)
                limits.append(min(max_new_tokens, max_seq_len - len(p)))
            outs = gen.generate(prompts, limits, seed * 1_000_003 + start) if prompts else []
            for p, g, limit in zip(prompts, outs, limits):
                if not g or (len(g) == 1 and g[0] in gen.eos):
                    bad["empty_response"] += 1
                    continue
                if g[-1] not in gen.eos:
                    state["num_truncated_generations"] += 1
                rows.append((p + g, [0] * len(p) + [1] * len(g)))
        else:
            for _, row in chunk:
                try:
                    rows.append(tokenize_chat(tokenizer, get_messages(row), max_seq_len))
                except BadRow as e:
                    bad[str(e)] += 1
        if rows:
            write_shard(out_dir, state["num_shards"], rows)
            state["num_shards"] += 1
        state["next_row"] = start + len(chunk)
        state["num_rows_written"] += len(rows)
        state["num_tokens"] += sum(len(r[0]) for r in rows)
        state["num_supervised_tokens"] += sum(sum(r[1]) for r in rows)
        state["bad"] = dict(bad)
        write_json_atomic(progress_path, state, indent=2)  # after the shard: a crash in between redoes one chunk at most
        if bar:
            bar.update(len(chunk))
    if bar:
        bar.close()
    stats = {k: state[k] for k in ("next_row", "num_shards", "num_rows_written", "num_tokens",
                                   "num_supervised_tokens", "num_truncated_generations")}
    stats.update({"num_input_rows": total, "num_bad_rows": sum(bad.values()), "bad": dict(bad),
                  "complete": state["next_row"] >= total})
    stats_path = os.path.join(out_dir, "stats.json")
    old_stats = None
    if os.path.isfile(stats_path):
        with open(stats_path) as f:
            old_stats = json.load(f)
    if old_stats != stats:  # a finished preparation, resumed, stays untouched
        write_json_atomic(stats_path, stats, indent=2)
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target-model", required=True, help="target dir (tokenizer + chat template; weights if --regenerate)")
    p.add_argument("--input", action="append", required=True, help="chat JSONL file (repeatable)")
    p.add_argument("--out-dir", required=True, help="parquet shards, progress.json and stats.json go here")
    p.add_argument("--max-seq-len", type=int, default=4096, help="longer rows are refused (reason too_long)")
    p.add_argument("--rows-per-shard", type=int, default=1000, help="input rows per shard (and per resume unit)")
    p.add_argument("--max-rows", type=int, default=None, help="use only the first N input rows")
    p.add_argument("--regenerate", action="store_true", help="answer each prompt with the target itself")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (0 = greedy)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64, help="prompts per generate call (transformers)")
    p.add_argument("--engine", default="auto", choices=["auto", "vllm", "transformers"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    try:
        if args.max_seq_len < 2 or args.rows_per_shard < 1 or args.batch_size < 1 or args.max_new_tokens < 1:
            raise ValueError("--max-seq-len >= 2, --rows-per-shard, --batch-size and --max-new-tokens >= 1")
        if args.temperature < 0:
            raise ValueError("--temperature must be >= 0")
        stats = prepare(args.target_model, args.input, args.out_dir, max_seq_len=args.max_seq_len,
                        rows_per_shard=args.rows_per_shard, regenerate=args.regenerate,
                        temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size, engine=args.engine, device=args.device, seed=args.seed,
                        max_rows=args.max_rows, progress=not args.no_progress)
    except (ValueError, OSError) as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"{PROG}: {stats['num_rows_written']} rows kept in {stats['num_shards']} shards "
          f"({stats['num_tokens']} tokens, {stats['num_supervised_tokens']} supervised); "
          f"{stats['num_bad_rows']} refused: " + (", ".join(f"{k} {v}" for k, v in sorted(stats["bad"].items()))
                                                  or "none"))
    if stats["num_truncated_generations"]:
        print(f"{PROG}: note: {stats['num_truncated_generations']} generations hit --max-new-tokens (kept, no EOS)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
