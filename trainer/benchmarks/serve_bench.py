"""Serving speed of a DFlash drafter: batch-1 greedy decoding, the target alone vs the product's speculative loop.

    python -m benchmarks.serve_bench --target-model TARGET --drafter EXPORT --prompts held_out.jsonl \
        --num-prompts 32 --max-new-tokens 256 --device cuda --dtype bfloat16 [--compile | --cuda-graphs] \
        --out report.json

Both paths decode the same prompts, greedily, one sequence at a time, in the same dtype and with the same
compilation setting (--compile: torch.compile of the target's decoder layers, used by both, and the drafter's
layers; default eager; --cuda-graphs: the drafter's block forward replayed from CUDA graphs, as a server runs its
drafter, eval/draft_graphs.py; the target eager on both paths):
  plain        transformers' generate with the static KV cache where the model supports it (else dynamic);
               generate's own automatic compilation is off, so only --compile decides.
  speculative  dflash_trainer.eval.spec_decode.speculative_decode with the drafter (DFlashProposer), block B.
Printed: tokens/s of both, the speedup, τ, losslessness, and the speculative loop's per-step overhead (drafting,
verify, bookkeeping; from a separate pass that synchronizes the GPU at each step's end, so the timed pass is
unperturbed). --repeats R times both paths R times, taking turns, and reports the pair with the median speedup and
every pair beside it: two single passes of one setting on one H100 differed by 12 % (PROOF.md run 25).

Losslessness is defined against the verify forward's greedy choice: the loop emits only tokens that are the
argmax of a target forward, so its output is the target's greedy decode up to rounding. In bf16 a 16-token verify
and a 1-token decode can round a near-tie differently; each divergence from plain decoding is therefore reported
with its logit margin (a forward of the target over prompt + the common prefix: the logit of plain's token minus
the logit of the speculative token at the first differing position). `lossless` holds when no divergence has a
margin above --tie-margin.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from dflash_trainer.eval.evaluate import add_decoding_args, eos_ids, load_drafter, load_prompts, load_target
from dflash_trainer.eval.draft_graphs import DEFAULT_BUCKET
from dflash_trainer.eval.spec_decode import DFlashProposer, reference_greedy, speculative_decode, summarize
from dflash_trainer.model.target import compile_decoder_layers

PHASES = ("drafter", "verify", "bookkeeping")


def plain_decode(model, prompts, max_new_tokens, eos, static_cache: bool):
    """generate on every prompt; returns (results, the cache actually used)."""
    if static_cache:
        try:
            return [reference_greedy(model, p, max_new_tokens, eos, static_cache=True) for p in prompts], "static"
        except (ValueError, TypeError, NotImplementedError) as e:  # models without a static cache
            print(f"serve_bench: static cache unsupported ({' '.join(str(e).split())[:120]}); dynamic cache")
    return [reference_greedy(model, p, max_new_tokens, eos) for p in prompts], "dynamic"


def overhead_table(results) -> list[dict]:
    """Per-step time of each phase of the speculative loop (mean over all steps of all prompts)."""
    steps = [t for r in results for t in r.step_times]
    total = sum(sum(t) for t in steps) or 1.0
    rows = []
    for i, phase in enumerate(PHASES):
        s = sum(t[i] for t in steps)
        rows.append({"phase": phase, "ms_per_step": 1000 * s / max(len(steps), 1), "share": s / total,
                     "total_s": s})
    return rows


@torch.no_grad()
def divergences(model, prompts, spec, plain, device) -> list[dict]:
    """The first position where speculative and plain decoding differ, per prompt, with the logit margin."""
    out = []
    for i, (p, a, b) in enumerate(zip(prompts, spec, plain)):
        if a == b:
            continue
        j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if j is None:  # one is a prefix of the other (an EOS or the length cap): no token choice to weigh
            out.append({"prompt": i, "position": min(len(a), len(b)), "margin": None})
            continue
        logits = model(input_ids=torch.tensor([p + a[:j]], device=device)).logits[0, -1].float()
        out.append({"prompt": i, "position": j, "speculative_token": a[j], "plain_token": b[j],
                    "margin": float(logits[b[j]] - logits[a[j]])})
    return out


def split_warmup(prompts: list, num_prompts: int, warmup: int) -> tuple[list, list, bool]:
    """The measured prompts (the first num_prompts) and the warm-up's: the prompts after them where the file has
    them, so the timed pass meets shapes a warm server has not seen on these very prompts; else the measured ones'
    first (the third value says which)."""
    measured, rest = prompts[:num_prompts], prompts[num_prompts:]
    if len(rest) >= warmup:
        return measured, rest[:warmup], True
    return measured, measured[:warmup], False


def timed_pair(model, prompts, proposer, block_size, max_new_tokens, eos, static_cache):
    """One timed pass of each path over all prompts: (plain results, cache, speculative results, figures)."""
    plain, cache = plain_decode(model, prompts, max_new_tokens, eos, static_cache)
    spec = [speculative_decode(model, p, proposer, block_size, max_new_tokens, eos) for p in prompts]
    plain_s, spec_s = sum(r.wall_s for r in plain), sum(r.wall_s for r in spec)
    plain_tps = sum(len(r.tokens) for r in plain) / plain_s if plain_s > 0 else None
    spec_tps = sum(len(r.tokens) for r in spec) / spec_s if spec_s > 0 else None
    return plain, cache, spec, {
        "plain_tokens_per_s": plain_tps, "speculative_tokens_per_s": spec_tps,
        "speedup": spec_tps / plain_tps if spec_tps and plain_tps else None,
        "timed_ms_per_step": 1000 * spec_s / max(sum(len(r.step_times) for r in spec), 1)}


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far (dynamo's count; 0 when nothing is compiled)."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def median_pair(pairs: list[dict]) -> dict:
    """The pair of timed passes with the median speedup (the lower middle one for an even count): a pair that ran,
    so its tokens/s and its ratio agree."""
    return sorted(pairs, key=lambda f: f["speedup"] or 0.0)[(len(pairs) - 1) // 2]


def run(model, drafter, prompts, *, block_size, max_new_tokens, eos, static_cache, tie_margin,
        warmup_prompts, repeats: int = 1, cuda_graphs: bool = False) -> dict:
    device = next(model.parameters()).device
    proposer = DFlashProposer(drafter, cuda_graphs=cuda_graphs)
    graphs_before = compiled_graphs()
    t_warm = time.perf_counter()
    for p in warmup_prompts:  # compile / allocator / kernel selection outside the timed passes
        plain_decode(model, [p], max_new_tokens, eos, static_cache)
        speculative_decode(model, p, proposer, block_size, max_new_tokens, eos)
    graphs_warm = compiled_graphs()
    captured_warm = proposer.graphs.captured if cuda_graphs else 0
    # at once, not with the report: a compiled warm-up can take minutes, and a call cut short still shows how far it got
    print(f"serve_bench: warm-up of {len(warmup_prompts)} prompts took {time.perf_counter() - t_warm:.1f} s "
          f"({graphs_warm - graphs_before} graphs compiled, {captured_warm} drafter CUDA graphs captured); timing "
          f"{repeats} pair(s) of passes", flush=True)
    # the two paths take turns, `repeats` times: the headline is the median pair, the spread is the noise that a
    # difference between two exports or settings has to beat
    timed = [timed_pair(model, prompts, proposer, block_size, max_new_tokens, eos, static_cache)
             for _ in range(repeats)]
    graphs = {"warmup": graphs_warm - graphs_before, "timed": compiled_graphs() - graphs_warm}
    # a context bucket first met in the timed passes is captured there (a few forwards' time)
    captured = ({"warmup": captured_warm, "timed": proposer.graphs.captured - captured_warm} if cuda_graphs
                else None)
    plain, cache, spec, _ = timed[0]
    pairs = [figures for *_, figures in timed]
    same_tokens = all([r.tokens for r in p2] == [r.tokens for r in plain] and
                      [r.tokens for r in s2] == [r.tokens for r in spec] for p2, _, s2, _ in timed[1:])
    profiled = [speculative_decode(model, p, proposer, block_size, max_new_tokens, eos, profile=True)
                for p in prompts]
    plain_tokens = sum(len(r.tokens) for r in plain)
    summary = summarize(spec, block_size)
    headline = median_pair(pairs)
    summary["tokens_per_s"] = headline["speculative_tokens_per_s"]
    divs = divergences(model, prompts, [r.tokens for r in spec], [r.tokens for r in plain], device)
    bad = [d for d in divs if d["margin"] is None or abs(d["margin"]) > tie_margin]
    return {
        "num_prompts": len(prompts), "block_size": block_size, "max_new_tokens": max_new_tokens,
        "plain": {"tokens_per_s": headline["plain_tokens_per_s"], "new_tokens": plain_tokens,
                  "wall_s": sum(r.wall_s for r in plain), "cache": cache},
        "speculative": summary,
        "speedup": headline["speedup"],
        "repeats": pairs, "repeats_same_tokens": same_tokens,
        "tau": summary["tau"],
        "lossless": not bad, "tie_margin": tie_margin,
        "num_identical_prompts": len(prompts) - len(divs), "divergences": divs,
        "overhead": overhead_table(profiled),
        # the profiled pass's own wall time per step, beside the timed pass's, so a gap between the two is visible
        "profiled_ms_per_step": 1000 * sum(r.wall_s for r in profiled)
                                / max(sum(len(r.step_times) for r in profiled), 1),
        "timed_ms_per_step": headline["timed_ms_per_step"],
        "compiled_graphs": graphs,
        "drafter_cuda_graphs": captured,
    }


def format_report(r: dict) -> str:
    lines = [f"prompts {r['num_prompts']}, block {r['block_size']}, max new tokens {r['max_new_tokens']}",
             f"plain        {r['plain']['tokens_per_s']:.1f} tokens/s ({r['plain']['new_tokens']} tokens, "
             f"{r['plain']['cache']} cache)",
             f"speculative  {r['speculative']['tokens_per_s']:.1f} tokens/s ({r['speculative']['num_new_tokens']} "
             f"tokens, {r['speculative']['num_steps']} steps)",
             f"speedup      {r['speedup']:.2f}x" + (
                 f" (median of {len(r['repeats'])} pairs of timed passes, "
                 f"{min(f['speedup'] for f in r['repeats']):.2f}-{max(f['speedup'] for f in r['repeats']):.2f}x)"
                 if len(r.get("repeats", [])) > 1 else ""),
             f"tau          {r['tau']:.2f}",
             f"lossless     {r['lossless']} ({r['num_identical_prompts']}/{r['num_prompts']} prompts identical to "
             f"plain; divergences within a logit margin of {r['tie_margin']} count as near-ties)"]
    for d in r["divergences"]:
        lines.append(f"  divergence prompt {d['prompt']} at {d['position']}: margin {d['margin']}")
    lines += ["", f"{'phase':<12} {'ms/step':>9} {'share':>7}"]
    for row in r["overhead"]:
        lines.append(f"{row['phase']:<12} {row['ms_per_step']:>9.3f} {100 * row['share']:>6.1f}%")
    lines.append(f"wall per step: timed pass {r['timed_ms_per_step']:.3f} ms, "
                 f"profiled pass {r['profiled_ms_per_step']:.3f} ms")
    if "warmup" in r:
        w = r["warmup"]
        lines.append(f"warm-up: {w['prompts']} prompts, " + ("after the measured ones" if w["held_apart"]
                                                            else "the measured ones' first"))
    if r.get("settings", {}).get("compile"):
        g = r["compiled_graphs"]
        lines.append(f"compiled graphs: {g['warmup']} in the warm-up, {g['timed']} in the timed passes"
                     + (" (the timed passes paid for compiling: give --warmup more prompts)" if g["timed"] else ""))
    if r.get("drafter_cuda_graphs"):
        g = r["drafter_cuda_graphs"]
        lines.append(f"drafter CUDA graphs: {g['warmup']} captured in the warm-up, {g['timed']} in the timed passes"
                     + (" (a longer context met there: give --warmup longer prompts)" if g["timed"] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="serve_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decoding_args(p)  # dflash-eval's flags, declared once there
    p.set_defaults(num_prompts=32, device="cuda", dtype="bfloat16")  # a GPU speed measurement, not a τ check
    p.add_argument("--compile", action="store_true", help="torch.compile the target's decoder layers (both paths) "
                   "and the drafter's layers")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend with --compile ('eager': "
                   "dynamo's graphs and guards without code generation, for a check of the graphs alone)")
    p.add_argument("--cuda-graphs", action="store_true", help="replay the drafter's block forward from CUDA graphs, "
                   f"one per context bucket of {DEFAULT_BUCKET} positions (the target stays eager; not with --compile)")
    p.add_argument("--no-static-cache", action="store_true", help="plain path: generate's dynamic cache")
    p.add_argument("--tie-margin", type=float, default=0.5, help="logit margin under which a divergence from "
                   "plain decoding is a rounding near-tie")
    p.add_argument("--repeats", type=int, default=1, help="timed passes of each path, taking turns; the speedup "
                   "is their median and the report gives the spread (a difference smaller than it is noise)")
    p.add_argument("--warmup", type=int, default=1, help="prompts decoded untimed first, on both paths: those "
                   "after the measured ones where the file has them, else the measured ones' first")
    args = p.parse_args(argv)
    try:
        if args.drafter is None:
            raise ValueError("--drafter is required: the export (or checkpoint) whose decoding speed is measured")
        if args.cuda_graphs and args.compile:
            raise ValueError("--cuda-graphs captures the eager drafter on CUDA: drop --compile or --cuda-graphs")
        if args.device == "auto":
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda but no CUDA device is visible; pass --device cpu for a function check")
        if args.cuda_graphs and args.device != "cuda":
            raise ValueError("--cuda-graphs captures the eager drafter on CUDA: pass --device cuda, or drop "
                             "--cuda-graphs")
        if args.num_prompts < 1 or args.max_new_tokens < 2 or args.warmup < 0 or args.repeats < 1:
            raise ValueError("--num-prompts must be >= 1, --max-new-tokens >= 2, --warmup >= 0 and --repeats >= 1")
        device, dtype = torch.device(args.device), getattr(torch, args.dtype)
        model, tokenizer = load_target(args.target_model, device, dtype)
        drafter = load_drafter(args.drafter, model, device, dtype)
        prompts, warmup_prompts, held_apart = split_warmup(
            load_prompts(args.prompts, tokenizer, args.num_prompts + args.warmup), args.num_prompts, args.warmup)
    except (ValueError, OSError) as e:
        print(f"serve_bench: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if args.compile:
        # the target's decoder layers as dflash-train compiles them; about four graphs each (the cache's layer index
        # and kind, prefill or decode), hence the limit: above it the later layers would fall back to eager.
        # Dynamic from the first call: prompt and cache lengths vary, and a first static graph per layer would be
        # compiled again as a dynamic one at the next length (in the timed passes, after a one-prompt warm-up).
        compile_decoder_layers(model.model.layers, model.config, recompile_limit=8 * len(model.model.layers),
                               backend=args.compile_backend, dynamic=True)
        drafter.compile_layers(backend=args.compile_backend, dynamic=True)
    t0 = time.perf_counter()
    report = run(model, drafter, prompts, block_size=args.block_size or drafter.cfg.block_size,
                 max_new_tokens=args.max_new_tokens, eos=eos_ids(args.target_model, model, tokenizer),
                 static_cache=not args.no_static_cache, tie_margin=args.tie_margin, warmup_prompts=warmup_prompts,
                 repeats=args.repeats, cuda_graphs=args.cuda_graphs)
    report["warmup"] = {"prompts": len(warmup_prompts), "held_apart": held_apart}
    report["settings"] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                          "dtype": args.dtype, "compile": args.compile, "cuda_graphs": args.cuda_graphs,
                          "target_model": os.path.abspath(args.target_model),
                          "drafter": os.path.abspath(args.drafter), "bench_wall_s": time.perf_counter() - t0}
    print(format_report(report))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
