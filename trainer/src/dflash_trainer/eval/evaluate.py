"""dflash-eval: does the drafter draft? τ of greedy speculative decoding vs a prompt-lookup baseline.

    dflash-eval --target-model TARGET_DIR --drafter EXPORT_OR_CHECKPOINT --prompts prompts.jsonl \
        --max-new-tokens 256 --num-prompts 32 --out report.json

--drafter is an export dir (config.json with dflash_config), a checkpoints/step-N dir, or a training
--output-dir (its latest checkpoint). --prompts is JSONL ({"messages": [...]} rendered with the target's
chat template and a generation prompt: the messages before the first assistant turn, or all of a conversation that
ends with a user turn; {"prompt"|"text": "..."} wrapped as one user turn when the
tokenizer has a chat template, else tokenized raw; {"input_ids": [...]} used as is) or plain text, one
prompt a line.

For every prompt: the target's greedy decode through transformers' generate (the reference), then
greedy speculative decoding with the drafter (block B), and with prompt-lookup n-gram drafting (same B).
Reported per method: τ = mean (accepted + 1) per verification step, the histogram of accept lengths,
per-slot acceptance, new tokens per target forward (prefill counted), wall time, and losslessness:
prompts whose output differs from the reference, with the first differing position.
Exit status 0 also when outputs differ (the report says so); 2 for bad flags or inputs.
--workers K decodes K prompts at once in K processes on the device (eval/workers.py): the same figures, faster for
a small target whose one-at-a-time decoding is bound by the host; tok/s is then per stream (with --replay only the
references).
--replay computes each method's figures from the references instead of decoding (eval/replay.py): one target and
one drafter forward per prompt; the same accept lengths as the decode wherever rounding turns no near-tie (SmolLM2's
78 other-styles prompts: every prompt's the same); losslessness is not checked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from dflash_trainer.eval.prompt_progress import PromptProgress, each
from dflash_trainer.eval.decode_attention import use_plan_free_attention
from dflash_trainer.prep.chat_tokens import prompt_messages
from dflash_trainer.eval.replay import accept_length_by_position, replay_dflash, replay_proposer
from dflash_trainer.eval.workers import DecodePool
from dflash_trainer.eval.spec_decode import (PROMPT_LOOKUP_NGRAM, DFlashProposer, PromptLookupProposer,
                                             reference_greedy, speculative_decode, summarize)

PROG = "dflash-eval"


def load_target(target_dir: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM
    use_plan_free_attention(device)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    tokenizer = None
    if any(os.path.isfile(os.path.join(target_dir, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
    return model, tokenizer


def eos_ids(target_dir: str, model, tokenizer) -> set[int]:
    ids = set()
    eos = getattr(model.generation_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def load_drafter(path: str, target, device: torch.device, dtype: torch.dtype):
    """Export dir, checkpoints/step-N dir, or training output dir -> a DFlashDrafter with the target's tables."""
    from dflash_trainer.loop.checkpoint import find_latest, load_checkpoint
    from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
    from dflash_trainer.export.exporter import load_exported_drafter

    config_path = os.path.join(path, "config.json")
    if os.path.isfile(config_path) and "dflash_config" in json.load(open(config_path)):
        drafter = load_exported_drafter(path, target_model=None, dtype=dtype)
    else:
        ckpt = path if os.path.isfile(os.path.join(path, "drafter_config.json")) else find_latest(path)
        if ckpt is None:
            raise ValueError(f"--drafter {path} is neither an export dir, a checkpoints/step-N dir nor a training "
                             "output dir with checkpoints; pass one of those")
        state, cfg, _ = load_checkpoint(ckpt)
        drafter = DFlashDrafter(DrafterConfig.from_dict(cfg))
        drafter.load_trainable_state_dict(state)
    drafter.load_frozen(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
    vocab = target.get_input_embeddings().weight.shape[0]
    if drafter.cfg.vocab_size != vocab:
        raise ValueError(f"the drafter was built for vocabulary {drafter.cfg.vocab_size}, the target has {vocab}; "
                         "pass the target it was trained against")
    return drafter.to(device=device, dtype=dtype).eval()


def _prompt_rows(path: str):
    """(line number, the row: a JSON value, or the line's text when it is not JSON) for each non-blank line."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except ValueError:
                yield n, line


def load_prompts(path: str, tokenizer, limit: int | None = None) -> list[list[int]]:
    prompts = []
    for n, obj in _prompt_rows(path):
        if isinstance(obj, dict) and "input_ids" in obj:
            prompts.append([int(t) for t in obj["input_ids"]])
        else:
            if tokenizer is None:
                raise ValueError(f"{path}:{n}: text prompts need a tokenizer in --target-model; "
                                 "give {\"input_ids\": [...]} rows instead")
            if isinstance(obj, dict) and "messages" in obj:
                text = tokenizer.apply_chat_template(prompt_messages(obj["messages"]), tokenize=False,
                                                     add_generation_prompt=True)
            else:
                raw = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else obj
                if not isinstance(raw, str):
                    raise ValueError(f"{path}:{n}: expected messages, prompt, text or input_ids")
                if getattr(tokenizer, "chat_template", None):
                    text = tokenizer.apply_chat_template([{"role": "user", "content": raw}], tokenize=False,
                                                         add_generation_prompt=True)
                else:
                    text = raw
            prompts.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise ValueError(f"--prompts {path} holds no prompt")
    return prompts


def prompt_styles(path: str, limit: int | None = None) -> list[str | None]:
    """Each prompt's "style" (the other-styles set's rows carry one; None where a row has none), in load_prompts'
    order, so a report can give τ per style."""
    styles = []
    for _n, obj in _prompt_rows(path):
        styles.append(obj.get("style") if isinstance(obj, dict) else None)
        if limit is not None and len(styles) >= limit:
            break
    return styles


def tau_by_style(method: dict, styles: list[str | None]) -> dict[str, float | None]:
    """τ of each style's prompts (their accepted lengths over their verification steps), in first-seen order."""
    parts: dict[str, list[int]] = {}
    for style, steps, accepted in zip(styles, method["prompt_steps"], method["prompt_accepted"], strict=True):
        if style is not None:
            total = parts.setdefault(style, [0, 0])
            total[0] += accepted
            total[1] += steps
    return {style: (a / n if n else None) for style, (a, n) in parts.items()}


def check_lossless(outputs: list[list[int]], references: list[list[int]]) -> dict:
    mismatches = []
    for i, (out, ref) in enumerate(zip(outputs, references)):
        if out != ref:
            pos = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
            mismatches.append({"prompt": i, "first_position": pos, "len_output": len(out), "len_reference": len(ref)})
    return {"lossless": not mismatches, "num_prompts": len(outputs), "num_mismatched_prompts": len(mismatches),
            "mismatches": mismatches}


def decode_all(prompts, spec, local, block_size, max_new_tokens, eos, progress, label, pool=None) -> list:
    """Every prompt's DecodeResult, in order: `local(prompt)` in this process, or through `pool` (workers.py),
    which decodes by `spec` (None: the reference; ("prompt_lookup", n); ("dflash", path))."""
    if pool is None:
        return [local(p) for p in each(progress, label, prompts)]
    results = pool.decode(spec, prompts, block_size, max_new_tokens, eos)
    return [r for _, r in zip(each(progress, label, prompts), results)]  # progress after each result


def run_method(model, prompts, proposer, block_size, max_new_tokens, eos, references, progress=None,
               label: str = "decode", pool=None, spec=None) -> dict:
    results = decode_all(prompts, spec,
                         lambda p: speculative_decode(model, p, proposer, block_size, max_new_tokens, eos),
                         block_size, max_new_tokens, eos, progress, label, pool)
    summary = summarize(results, block_size)
    summary.update(check_lossless([r.tokens for r in results], references))
    return summary


def replay_method(replay_one, prompts, references, block_size, progress=None, label: str = "replay") -> dict:
    """run_method's figures by replaying the decode over the references (replay.py): `replay_one(prompt,
    reference)` gives one prompt's DecodeResult. Losslessness is assumed, not checked: `lossless` is None."""
    results = [replay_one(p, r) for p, r in zip(each(progress, label, prompts), references)]
    summary = summarize(results, block_size)
    summary.update({"replayed": True, "lossless": None, "num_prompts": len(prompts),
                    "accept_length_by_position": accept_length_by_position(results)})
    return summary


def evaluate(model, prompts: list[list[int]], *, drafter=None, block_size: int, max_new_tokens: int,
             eos: set[int], ngram: int = PROMPT_LOOKUP_NGRAM, baseline: bool = True, references=None,
             progress: PromptProgress | None = None, pool=None, drafter_path: str | None = None,
             styles: list[str | None] | None = None, replayed: bool = False) -> dict:
    """The report dict; `references` (a previous report's) skips recomputing the greedy decodes; `progress`
    reports each prompt of each method (prompt_progress.py). With a `pool` (workers.py) the decoding runs in its
    processes, which load the drafter from `drafter_path` (`drafter` is then not used). With `styles`
    (prompt_styles) each method also reports `tau_by_style`. `replayed`: the methods' figures by replaying the
    decode over the references in this process (replay.py; needs `drafter`), losslessness not checked."""
    if replayed and drafter is None and drafter_path is not None:
        raise ValueError("a replayed evaluation runs in this process and needs the drafter loaded (drafter)")
    if pool is not None and drafter is not None and drafter_path is None:
        raise ValueError("decoding in worker processes needs the drafter's path (drafter_path)")
    with_drafter = drafter is not None or (pool is not None and drafter_path is not None)
    report = {"block_size": block_size, "max_new_tokens": max_new_tokens, "num_prompts": len(prompts),
              "methods": {}}
    if references is None:
        refs = decode_all(prompts, None, lambda p: reference_greedy(model, p, max_new_tokens, eos),
                          block_size, max_new_tokens, eos, progress, "target only", pool)
        wall = sum(r.wall_s for r in refs)
        n_tok = sum(len(r.tokens) for r in refs)
        report["target_only"] = {"num_new_tokens": n_tok, "wall_s": round(wall, 3),
                                 "tokens_per_s": n_tok / wall if wall else None, "tau": 1.0,
                                 "tokens_per_target_forward": 1.0}
        references = [r.tokens for r in refs]
    report["references"] = references
    if replayed:
        report["replayed"] = True
        if drafter is not None:
            report["methods"]["dflash"] = replay_method(
                lambda p, r: replay_dflash(model, drafter, p, r, block_size, max_new_tokens), prompts, references,
                block_size, progress, "dflash (replayed)")
        if baseline:
            lookup = PromptLookupProposer(ngram)
            report["methods"][f"prompt_lookup_n{ngram}"] = replay_method(
                lambda p, r: replay_proposer(lookup, p, r, block_size, max_new_tokens), prompts, references,
                block_size, progress, f"prompt_lookup_n{ngram} (replayed)")
    elif with_drafter:
        proposer = DFlashProposer(drafter) if pool is None else None
        report["methods"]["dflash"] = run_method(model, prompts, proposer, block_size, max_new_tokens, eos,
                                                 references, progress, "dflash", pool, ("dflash", drafter_path))
    if baseline and not replayed:
        report["methods"][f"prompt_lookup_n{ngram}"] = run_method(
            model, prompts, PromptLookupProposer(ngram), block_size, max_new_tokens, eos, references, progress,
            f"prompt_lookup_n{ngram}", pool, ("prompt_lookup", ngram))
    if styles is not None and any(st is not None for st in styles):
        for method in report["methods"].values():
            method["tau_by_style"] = tau_by_style(method, styles)
    return report


def format_table(report: dict) -> str:
    rows = [("method", "tau", "tok/fwd", "steps", "new tok", "tok/s", "lossless")]
    if "target_only" in report:
        t = report["target_only"]
        rows.append(("target only (generate)", "1.00", "1.00", "-", str(t["num_new_tokens"]),
                     f"{t['tokens_per_s']:.1f}" if t["tokens_per_s"] else "-", "reference"))
    for name, m in report["methods"].items():
        rows.append((name, f"{m['tau']:.2f}" if m["tau"] else "-",
                     f"{m['tokens_per_target_forward']:.2f}", str(m["num_steps"]), str(m["num_new_tokens"]),
                     f"{m['tokens_per_s']:.1f}" if m["tokens_per_s"] else "-",
                     "replayed" if m.get("replayed") else "yes" if m["lossless"]
                     else f"NO ({m['num_mismatched_prompts']} prompts)"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    for name, m in report["methods"].items():
        hist = " ".join(f"{k}:{v}" for k, v in m["accept_length_histogram"].items() if v)
        lines.append(f"{name}: accept-length histogram {hist}")
        lines.append(f"{name}: per-slot acceptance {' '.join(f'{x:.2f}' for x in m['slot_accept_rate'])}")
        if m.get("tau_by_style"):
            lines.append(f"{name}: τ by style {format_styles(m['tau_by_style'])}")
        if m.get("accept_length_by_position"):
            lines.append(f"{name}: accept length by output position (every anchor) "
                         f"{format_styles(m['accept_length_by_position'])}")
    return "\n".join(lines)


def format_styles(by_style: dict[str, float | None]) -> str:
    return ", ".join(f"{style} {'-' if tau is None else format(tau, '.2f')}" for style, tau in by_style.items())


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    """The flags every decoding tool shares (dflash-eval, benchmarks/serve_bench.py), declared once here; a tool
    that serves another purpose changes a default with set_defaults, in the open."""
    p.add_argument("--target-model", required=True)
    p.add_argument("--drafter", default=None, help="export dir, checkpoints/step-N or training output dir; "
                                                   "leave out for the baseline only")
    p.add_argument("--prompts", required=True, help="JSONL (messages / prompt / text / input_ids) or plain text")
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts")
    p.add_argument("--block-size", type=int, default=None, help="default: the drafter's (16 without a drafter)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="float32 keeps greedy ties away from kernel-order noise (exact losslessness check)")
    p.add_argument("--out", default=None, help="write the JSON report here")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decoding_args(p)
    p.add_argument("--ngram", type=int, default=PROMPT_LOOKUP_NGRAM,
                   help="longest n-gram the prompt-lookup baseline matches")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--replay", action="store_true",
                   help="τ by replaying the decode over the target's reference outputs (eval/replay.py): two forwards "
                        "per prompt instead of one target forward per step, the same accept lengths in exact "
                        "arithmetic; losslessness is assumed, not checked (the table says `replayed`)")
    p.add_argument("--workers", type=int, default=1,
                   help="decoding processes on the device, each with its own copy of the target and drafter "
                        "(eval/workers.py: same figures, tok/s per stream; for small targets)")
    args = p.parse_args(argv)
    try:
        if args.workers < 1:
            raise ValueError("--workers must be at least 1")
        device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
        if not os.path.isfile(os.path.join(args.target_model, "config.json")):
            raise ValueError(f"--target-model {args.target_model} has no config.json")
        t0 = time.time()
        model, tokenizer = load_target(args.target_model, device, dtype)
        drafter = load_drafter(args.drafter, model, device, dtype) if args.drafter else None
        block = args.block_size or (drafter.cfg.block_size if drafter is not None else 16)
        if block < 2:
            raise ValueError("--block-size must be at least 2")
        prompts = load_prompts(args.prompts, tokenizer, args.num_prompts)
        styles = prompt_styles(args.prompts, args.num_prompts)
        pool = DecodePool(args.target_model, device, dtype, args.workers) if args.workers > 1 else None
        try:
            report = evaluate(model, prompts, drafter=drafter, block_size=block,
                              max_new_tokens=args.max_new_tokens, eos=eos_ids(args.target_model, model, tokenizer),
                              ngram=args.ngram, baseline=not args.no_baseline, progress=PromptProgress(),
                              pool=pool, drafter_path=args.drafter, styles=styles, replayed=args.replay)
        finally:
            if pool is not None:
                pool.close()
    except (ValueError, OSError) as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    report.update({"target_model": args.target_model, "drafter": args.drafter, "device": str(device),
                   "dtype": args.dtype, "workers": args.workers, "elapsed_s": round(time.time() - t0, 1)})
    if drafter is not None:
        report["drafter_config"] = drafter.cfg.to_dict()
    print(format_table(report))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
