"""dflash-synthesize-prompts: user prompts written by the target itself, for data that covers what users ask.

The target is given its chat template up to the start of a user turn (the "pre-query" prefix: the template's
default system prompt, if any, then the user role's header) and samples the user's message until its end-of-turn
token, the self-synthesis of Magpie (Xu et al., 2024): an instruction-tuned model writes the kinds of requests it
was tuned on, in the styles of its tuning data, without seed prompts. Each kept message becomes a chat row
{"messages": [{"role": "user", "content": ...}]}, the shape dflash-prepare-data (--regenerate) answers.

A sample is refused, counted by reason, when it did not end within --max-new-tokens (truncated), has fewer than
--min-words words (too_short), holds a special token's text (special_token), repeats an earlier prompt's words
(duplicate), or overlaps a held-out prompt (held_out: the trainer's other-styles set and any --held-out file, by
the rule of heldout.py, as dflash-prepare-data applies it). Sampling stops at --num-prompts kept, at
--max-attempts samples, or when --time-budget-s has passed.

    dflash-synthesize-prompts --target-model TARGET_DIR --out synth.jsonl --num-prompts 20000 --device cuda \
        --batch-size 2048

--system-prompts FILE (one system message per non-blank line) steers what is asked: the samples take turns between
the template's own prefix and one per system message (the template rendered with that system message up to the
user's turn), e.g. "Users ask you to write small programs in Rust, Go, SQL, ..."; the stats count what each kept.

The file is written atomically with a record of its settings (`<out>.stats.json`); a rerun with the same settings
reuses it without sampling, and any other settings write it again.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from collections import Counter

from dflash_trainer.telemetry.heartbeat import write_json_atomic, write_text_atomic

from .chat_tokens import render
from .generate import Generator, add_decoding_flags, decoding_of
from .heldout import OTHER_STYLES, HeldOut, words
from .sources import file_sha256

PROG = "dflash-synthesize-prompts"
# Broad kinds of assistant requests, one system message each, for --system-prompts (the proof's
# --synthesize-system-prompts); they name kinds of requests the other-styles set was also written in (PROOF.md)
SHIPPED_SYSTEM_PROMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "synthesis_systems.txt")
_SENTINEL = "\x00dflash-user-message\x00"


def pre_query_ids(tokenizer, system: str | None = None) -> list[int]:
    """The chat template rendered up to where a user's message starts (the sentinel user message cut off), after
    `system` as the system message when given (else the template's own default, if any)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": _SENTINEL}]
    text = render(tokenizer, messages, add_generation_prompt=False)
    if _SENTINEL not in text:
        raise ValueError("the target's chat template drops the user's message; synthesize with another target")
    if system and system not in text:
        raise ValueError("the target's chat template drops the system message; leave --system-prompts out")
    return tokenizer(text[:text.index(_SENTINEL)], add_special_tokens=False)["input_ids"]


def read_system_prompts(path: str | None) -> list[str]:
    if path is None:
        return []
    with open(path, encoding="utf-8") as f:
        systems = [line.strip() for line in f if line.strip()]
    if not systems:
        raise ValueError(f"--system-prompts {path} holds no system message; give one per line or leave it out")
    return systems


def stats_path_of(out_path: str) -> str:
    return out_path + ".stats.json"


def _settings(target_model: str, num_prompts: int, temperature: float, max_new_tokens: int, min_words: int,
              max_attempts: int, seed: int, held_out: tuple[str, ...], systems: list[str]) -> dict:
    settings = {"target_model": os.path.abspath(target_model), "num_prompts": num_prompts,
                "temperature": temperature, "max_new_tokens": max_new_tokens, "min_words": min_words,
                "max_attempts": max_attempts, "seed": seed,
                "held_out": {os.path.abspath(p): file_sha256(p) for p in (OTHER_STYLES, *held_out)}}
    if systems:  # absent without them: a synthesis made before the flag existed is still reused
        settings["system_prompts"] = systems
    return settings


def reusable(out_path: str, settings: dict) -> dict | None:
    """The stats of an earlier synthesis with these settings whose file is still whole, else None."""
    try:
        with open(stats_path_of(out_path)) as f:
            record = json.load(f)
        with open(out_path, encoding="utf-8") as f:
            rows = sum(1 for line in f if line.strip())
    except (OSError, ValueError):
        return None
    if record.get("settings") != settings or rows != record.get("stats", {}).get("kept"):
        return None
    return dict(record["stats"], reused=True)


class PromptFilter:
    """Keeps a sampled message or names why not (the reasons of the module docstring)."""

    def __init__(self, tokenizer, eos: set[int], min_words: int, guard: HeldOut):
        self.tokenizer, self.eos, self.min_words, self.guard = tokenizer, eos, min_words, guard
        self.specials = [t for t in tokenizer.all_special_tokens + list(tokenizer.get_added_vocab()) if t.strip()]
        self.seen: set[tuple[str, ...]] = set()

    def reason(self, generated: list[int]) -> tuple[str | None, str]:
        if not generated or generated[-1] not in self.eos:
            return "truncated", ""
        text = self.tokenizer.decode(generated[:-1], skip_special_tokens=False).strip()
        if any(s in text for s in self.specials):
            return "special_token", text
        key = tuple(words(text))
        if len(key) < self.min_words:
            return "too_short", text
        if key in self.seen:
            return "duplicate", text
        if self.guard.overlap(text) is not None:
            return "held_out", text
        self.seen.add(key)
        return None, text


def synthesize_prompts(target_model: str, out_path: str, num_prompts: int, *, temperature: float = 1.0,
                       max_new_tokens: int = 128, min_words: int = 3, max_attempts: int | None = None,
                       batch_size: int = 64, engine: str = "auto", device: str = "auto", seed: int = 0,
                       held_out: tuple[str, ...] = (), time_budget_s: float | None = None,
                       system_prompts: str | None = None, reuse_only: bool = False, log=print,
                       decoding: dict | None = None) -> dict:
    """Samples prompts from the target into `out_path` (JSONL chat rows); returns the stats, also written with
    the settings to `<out_path>.stats.json`. max_attempts: at most this many samples (default 4 x num_prompts);
    reuse_only: an earlier synthesis of these settings must be there (another run's data, never rewritten);
    decoding: the Generator's decoding options (generate.DECODING_FLAGS; its defaults where absent)."""
    if num_prompts < 1:
        raise ValueError("--num-prompts must be at least 1")
    if temperature <= 0:
        raise ValueError("--temperature must be above 0: greedy sampling writes one prompt over and over")
    if max_new_tokens < 1 or batch_size < 1 or min_words < 1:
        raise ValueError("--max-new-tokens, --batch-size and --min-words must be at least 1")
    max_attempts = max_attempts if max_attempts is not None else 4 * num_prompts
    if max_attempts < num_prompts:
        raise ValueError(f"--max-attempts {max_attempts} is below --num-prompts {num_prompts}; raise it")
    guard = HeldOut.from_files([OTHER_STYLES, *held_out])  # a bad --held-out file fails before any sampling
    systems = read_system_prompts(system_prompts)
    settings = _settings(target_model, num_prompts, temperature, max_new_tokens, min_words, max_attempts, seed,
                         held_out, systems)
    done = reusable(out_path, settings)
    if done is not None:
        log(f"{PROG}: {out_path} already holds {done['kept']} prompts of these settings; reusing it")
        return done
    if reuse_only:
        raise ValueError(f"{out_path} holds no synthesis of these settings (or none); use the same --synthesize-prompts"
                         ", --seed and held-out sets as the run that made it, or leave --data-root out")
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(target_model)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"the tokenizer in {target_model} has no chat template; synthesis needs one")
    prefixes = [pre_query_ids(tokenizer)] + [pre_query_ids(tokenizer, system) for system in systems]
    gen = Generator(target_model, tokenizer, engine, device, temperature, max_new_tokens, batch_size, seed,
                    **(decoding or {}))
    keep = PromptFilter(tokenizer, gen.eos, min_words, guard)
    log(f"{PROG}: sampling with {gen.describe()}, temperature {temperature}, <= {max_new_tokens} tokens, batch "
        f"{batch_size}, until {num_prompts} prompts (at most {max_attempts} samples)")
    kept, refused, attempts, surplus, t0 = [], Counter(), 0, 0, time.time()
    kept_by_prefix = [0] * len(prefixes)
    while len(kept) < num_prompts and attempts < max_attempts:
        if time_budget_s is not None and time.time() - t0 > time_budget_s:
            log(f"{PROG}: time budget {time_budget_s:.0f} s reached after {attempts} samples")
            break
        n = min(batch_size, max_attempts - attempts)
        turns = [(attempts + i) % len(prefixes) for i in range(n)]  # the samples take turns between the prefixes
        batch = gen.generate([prefixes[t] for t in turns], [max_new_tokens] * n, seed * 1_000_003 + attempts)
        for turn, generated in zip(turns, batch):
            why, text = keep.reason(generated)
            if why:
                refused[why] += 1
            elif len(kept) < num_prompts:
                kept.append(text)
                kept_by_prefix[turn] += 1
            else:  # good, but the last batch went past --num-prompts
                surplus += 1
        attempts += n
    stats = {"kept": len(kept), "attempts": attempts, "surplus": surplus, "refused": dict(sorted(refused.items())),
             "seconds": round(time.time() - t0, 1), "engine": gen.engine, "reused": False}
    if systems:  # kept per prefix: the template's own, then one per system message in file order
        stats["kept_by_system_prompt"] = kept_by_prefix
    _write(out_path, kept)
    write_json_atomic(stats_path_of(out_path), {"settings": settings, "stats": stats}, indent=2)
    return stats


def _write(out_path: str, prompts: list[str]) -> None:
    """The chat rows, written then renamed: a failure leaves the old file (or none), never a temp file."""
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    write_text_atomic(out_path, "".join(json.dumps({"messages": [{"role": "user", "content": text}]},
                                                   ensure_ascii=False) + "\n" for text in prompts))


def synthesize_defaults() -> dict:
    """synthesize_prompts()'s keyword defaults: each declared once, in its signature."""
    return {k: v.default for k, v in inspect.signature(synthesize_prompts).parameters.items()}


def build_parser() -> argparse.ArgumentParser:
    d = synthesize_defaults()
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target-model", required=True, help="target dir (weights, tokenizer and chat template)")
    p.add_argument("--out", required=True, help="the JSONL of prompts to write")
    p.add_argument("--num-prompts", type=int, required=True, help="prompts to keep")
    p.add_argument("--temperature", type=float, default=d["temperature"], help="sampling temperature (above 0)")
    p.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"],
                   help="a prompt longer than this is refused (truncated)")
    p.add_argument("--min-words", type=int, default=d["min_words"], help="a shorter prompt is refused")
    p.add_argument("--max-attempts", type=int, default=None,
                   help="at most this many samples (default 4 x --num-prompts)")
    p.add_argument("--batch-size", type=int, default=d["batch_size"], help="samples per generate call")
    add_decoding_flags(p)
    p.add_argument("--engine", default=d["engine"], choices=["auto", "vllm", "transformers"])
    p.add_argument("--device", default=d["device"], choices=["auto", "cpu", "cuda"])
    p.add_argument("--seed", type=int, default=d["seed"])
    p.add_argument("--held-out", action="append", default=list(d["held_out"]), metavar="FILE",
                   help="a JSONL of held-out prompts (repeatable): an overlapping sample is refused; the other-styles "
                        "set always is")
    p.add_argument("--time-budget-s", type=float, default=d["time_budget_s"], help="stop sampling after this")
    p.add_argument("--system-prompts", default=d["system_prompts"], metavar="FILE",
                   help="system messages, one per line: the samples take turns between the template's own prefix "
                        "and one rendered with each (steers what the target asks)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        stats = synthesize_prompts(args.target_model, args.out, args.num_prompts, temperature=args.temperature,
                                   max_new_tokens=args.max_new_tokens, min_words=args.min_words,
                                   max_attempts=args.max_attempts, batch_size=args.batch_size, engine=args.engine,
                                   device=args.device, seed=args.seed, held_out=tuple(args.held_out),
                                   time_budget_s=args.time_budget_s, system_prompts=args.system_prompts,
                                   decoding=decoding_of(args))
    except (ValueError, OSError) as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"{PROG}: {stats['kept']} prompts in {args.out} from {stats['attempts']} samples; refused: "
          + (", ".join(f"{k} {v}" for k, v in stats["refused"].items()) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
