"""How fast dflash-prepare-data --regenerate answers prompts, per KV cache, attention and batch size: the product's
Generator (prep/generate.py, the one implementation) on a target of SmolLM2-135M-Instruct's shape with random weights (a
config, no download), greedy, every answer run to the cap (as 48 % of the proof's answers are). Issue 34's leases
spend ~700 s regenerating the proof's data (41,575 answers in 378 s on an H200 before the synthesized prompts);
this says where that time goes and what would shorten it.

    python -m benchmarks.regeneration --preset smollm2-135m --device cuda --out regeneration.json   # one GPU
    python -m benchmarks.regeneration --preset smollm2-135m-cpu                                    # that shape, CPU
    python -m benchmarks.regeneration                                                              # CPU (test)

Each row (a KV cache and an attention, prep/generate.py's options) answers one batch of prompts (lengths spread
evenly over the preset's range) twice: the first call pays any compilation, the second is the figure. `identical`
is the share of answers equal to the first row's (the dynamic cache with transformers' sdpa) at that batch size.
A regeneration's batches differ in prompt width, and a static cache's shape with them: `static-compiled` compiles
again for each new shape, so its first-call time, not its second, is what each of those batches would pay.
A torch.profiler table of a short dynamic-cache call says where a decoding step's time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from types import SimpleNamespace

from dflash_trainer.prep.generate import ATTENTIONS, CACHES, Generator

from .timing import each_call_s

PRESETS = {
    # SmolLM2-135M-Instruct's config (the proof's target); prompts as the proof's (chat template included)
    "smollm2-135m": dict(hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, vocab=49152,
                         prompt_len=(40, 400), new_tokens=160, batches=(2048,), profile_tokens=16),
    # the same shape on a CPU: a small batch, short answers (the mechanism's direction; times only from a GPU count)
    "smollm2-135m-cpu": dict(hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, vocab=49152,
                             prompt_len=(40, 400), new_tokens=32, batches=(32,), profile_tokens=4),
    "tiny-cpu": dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=512,
                     prompt_len=(4, 24), new_tokens=6, batches=(4, 8), profile_tokens=3),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny-cpu", help="the target's shape (default: CPU)")
    p.add_argument("--device", default="cpu", help="cuda or cpu (default: cpu)")
    p.add_argument("--caches", default=",".join(CACHES), help=f"KV caches to time (default: {','.join(CACHES)})")
    p.add_argument("--attentions", default=",".join(ATTENTIONS),
                   help=f"attentions to time with each cache (default: {','.join(ATTENTIONS)})")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    return p


def write_target(target_dir: str, shape: dict, device: str) -> None:
    """A Llama-family target of the preset's shape (SmolLM2's architecture), random weights, saved."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
                      num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                      num_key_value_heads=shape["kv_heads"], max_position_embeddings=8192, rope_theta=100000.0,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    LlamaForCausalLM(cfg).to(dtype).save_pretrained(target_dir, safe_serialization=True)


def prompts_of(shape: dict, n: int) -> list[list[int]]:
    """n prompts, lengths spread evenly over the preset's range, ids away from the pad (0) and EOS (the last id)."""
    import torch
    g = torch.Generator().manual_seed(n)
    lo, hi = shape["prompt_len"]
    return [torch.randint(1, shape["vocab"] - 1, (lo + (hi - lo) * i // max(n - 1, 1),), generator=g).tolist()
            for i in range(n)]


def time_generate(gen: Generator, prompts: list[list[int]], new_tokens: int, device) -> tuple[float, list]:
    """(seconds of one generate call between two synchronizations, its answers)"""
    times, out = each_call_s(lambda _i: gen.generate(prompts, [new_tokens] * len(prompts), chunk_seed=0), 1, device)
    return times[0], out


def profile_table(gen: Generator, prompts: list[list[int]], new_tokens: int, device) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        time_generate(gen, prompts, new_tokens, device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=48) + \
        "\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=48)


def run(preset: str, device_name: str, caches: list[str], attentions: list[str]) -> dict:
    import torch
    shape, device = PRESETS[preset], torch.device(device_name)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=shape["vocab"] - 1)
    rows, n_new = [], shape["new_tokens"]
    with tempfile.TemporaryDirectory() as target_dir:
        write_target(target_dir, shape, device_name)
        for batch in shape["batches"]:
            prompts = prompts_of(shape, batch)
            reference = None
            for cache in caches:
                for attention in attentions:
                    gen = Generator(target_dir, tokenizer, "transformers", device_name, 0.0, n_new, batch, 0,
                                    cache=cache, attention=attention)
                    first_s, _ = time_generate(gen, prompts, n_new, device)
                    second_s, out = time_generate(gen, prompts, n_new, device)
                    reference = out if reference is None else reference
                    rows.append(dict(cache=cache, attention=attention, batch=batch, first_s=first_s, s=second_s,
                                     step_ms=1e3 * second_s / n_new, answers_per_s=batch / second_s,
                                     tokens=sum(map(len, out)),
                                     identical=sum(a == b for a, b in zip(out, reference)) / len(out)))
                    print(f"  {cache:>16} {attention:>10} batch {batch:5d}: first {first_s:7.2f} s, then "
                          f"{second_s:7.2f} s ({rows[-1]['step_ms']:.1f} ms/step)", flush=True)
                    del gen
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
        gen = Generator(target_dir, tokenizer, "transformers", device_name, 0.0, n_new, shape["batches"][-1], 0)
        table = profile_table(gen, prompts, shape["profile_tokens"], device)  # the largest batch's prompts
    return dict(preset=preset, device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                torch=torch.__version__, rows=rows, profile=table)


def print_report(result: dict) -> None:
    print(f"\nregeneration, {result['preset']} on {result['device']} (torch {result['torch']}): one batch, greedy, "
          "every answer to the cap")
    print(f"{'cache':>16} {'attention':>10} {'batch':>6} {'s':>8} {'ms/step':>8} {'answers/s':>10} "
          f"{'vs first':>9} {'identical':>10}")
    first = {}
    for r in result["rows"]:
        first.setdefault(r["batch"], r["answers_per_s"])
        print(f"{r['cache']:>16} {r['attention']:>10} {r['batch']:6d} {r['s']:8.2f} {r['step_ms']:8.1f} "
              f"{r['answers_per_s']:10.1f} {r['answers_per_s'] / first[r['batch']]:8.2f}x {r['identical']:10.3f}")
    print("\nwhere a dynamic-cache call's time goes (torch.profiler, the largest batch):\n" + result["profile"])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    chosen = {}
    for flag, known in (("caches", CACHES), ("attentions", ATTENTIONS)):
        chosen[flag] = [c for c in getattr(args, flag).split(",") if c]
        unknown = sorted(set(chosen[flag]) - set(known))
        if unknown or not chosen[flag]:
            parser.error(f"unknown --{flag} {','.join(unknown) or '(none)'}; choose from {','.join(known)}")
    result = run(args.preset, args.device, chosen["caches"], chosen["attentions"])
    print_report(result)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
