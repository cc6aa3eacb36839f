"""How much sooner τ comes from replaying the decode over the target's references (dflash-eval --replay,
eval/replay.py) than from decoding: the product's evaluate() of the same drafter on the same prompts and references,
once decoding and once replayed, each method's time and figures side by side.

    python -m benchmarks.eval_replay --target-model ~/.cache/dflash/smollm2-135m-instruct \
        --drafter EXPORT --prompts trainer/src/dflash_trainer/prep/other_styles.jsonl --num-prompts 16 \
        --max-new-tokens 128                                    # a real target and drafter
    python -m benchmarks.eval_replay                            # the tiny random preset (the test)

The references (the target's greedy decodes) are made once, untimed: both ways need them (the proof keeps them in
its baseline cache). A row's seconds are the method's own (the sum over prompts of its decode, or of its replay).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

FIGURES = ("tau", "num_steps", "accept_length_histogram", "prompt_steps", "prompt_accepted")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target-model", default=None, help="a target dir (default: the tiny random preset)")
    p.add_argument("--drafter", default=None, help="its drafter's export (with --target-model)")
    p.add_argument("--prompts", default=None, help="JSONL prompts, as dflash-eval reads them (with --target-model)")
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default: CUDA where there is one)")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    return p


def measure(target: str, drafter_path: str, prompts, max_new_tokens: int | None, device) -> tuple[list[dict], dict]:
    import torch

    from dflash_trainer.eval.evaluate import eos_ids, evaluate, load_drafter, load_target

    model, tokenizer = load_target(target, device, torch.float32)
    drafter = load_drafter(drafter_path, model, device, torch.float32)
    if isinstance(prompts, str):
        from dflash_trainer.eval.evaluate import load_prompts
        prompts = load_prompts(prompts, tokenizer, None)
    common = dict(block_size=drafter.cfg.block_size, max_new_tokens=max_new_tokens,
                  eos=eos_ids(target, model, tokenizer) if tokenizer is not None else set())
    references = evaluate(model, prompts, baseline=False, **common)["references"]  # untimed
    decoded = evaluate(model, prompts, drafter=drafter, references=references, **common)
    replayed = evaluate(model, prompts, drafter=drafter, references=references, replayed=True, **common)
    rows = []
    for name, d in decoded["methods"].items():
        r = replayed["methods"][name]
        same = sum(a == b for a, b in zip(zip(d["prompt_steps"], d["prompt_accepted"]),
                                          zip(r["prompt_steps"], r["prompt_accepted"])))
        rows.append({"method": name, "decode_s": d["wall_s"], "replay_s": r["wall_s"],
                     "speedup": d["wall_s"] / r["wall_s"] if r["wall_s"] else None, "tau_decode": d["tau"],
                     "tau_replay": r["tau"], "prompts_same_steps": same, "num_prompts": len(prompts),
                     "same_figures": {k: d[k] for k in FIGURES} == {k: r[k] for k in FIGURES},
                     "lossless_decode": d["lossless"]})
    return rows, {"block_size": common["block_size"], "max_new_tokens": max_new_tokens, "num_prompts": len(prompts)}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from .eval_workers import PRESETS, write_models
    from .matmul_peak import benchmark_device
    device = benchmark_device(args.device, "eval_replay.py", "use --device cpu")
    if args.target_model and not (args.drafter and args.prompts):
        print("eval_replay.py: error: --target-model needs --drafter and --prompts; leave all three out for the "
              "tiny preset", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as root:
        if args.target_model:
            target, export, prompts, what = args.target_model, args.drafter, args.prompts, args.drafter
            if args.num_prompts:
                prompts = os.path.join(root, "prompts.jsonl")
                with open(args.prompts) as src, open(prompts, "w") as dst:
                    dst.writelines([line for line in src if line.strip()][:args.num_prompts])
            max_new = args.max_new_tokens
        else:
            target, export, d = write_models(root, "tiny-cpu")
            vocab = PRESETS["tiny-cpu"][0]["vocab_size"]
            # repeating prompts, so that prompt lookup's drafts are accepted as well as refused
            prompts = [[(7 * i + j) % (vocab - 1) for j in range(5)] * 3 for i in range(d["num_prompts"])]
            max_new, what = d["max_new_tokens"], "tiny-cpu (random weights)"
        rows, setting = measure(target, export, prompts, max_new, device)
    print(f"device: {device}; drafter {what}; block {setting['block_size']}; {setting['num_prompts']} prompts, "
          f"up to {setting['max_new_tokens']} new tokens each; references made once, untimed")
    print("\n| method | decode s | replay s | replay speedup | τ decode | τ replay | prompts with the same steps |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        speedup = f"{r['speedup']:.1f}x" if r["speedup"] else "- (replay under 1 ms)"
        print(f"| {r['method']} | {r['decode_s']:.3f} | {r['replay_s']:.3f} | {speedup} | "
              f"{r['tau_decode']:.4f} | {r['tau_replay']:.4f} | {r['prompts_same_steps']}/{r['num_prompts']} |")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"device": str(device), "setting": setting, "rows": rows, "torch": torch.__version__,
                       "drafter": what}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
