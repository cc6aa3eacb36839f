"""How much sooner an evaluation ends with its decoding spread over worker processes (dflash-eval --workers, the
proof's --eval-workers; dflash_trainer.eval.workers): the product's evaluate() of a drafter on the same prompts with
1, 2, 4, ... processes on one device, timed whole, its figures checked against the one-process run.

    python -m benchmarks.eval_workers --preset smollm2-135m --workers 1,2,4,8     # one GPU
    python -m benchmarks.eval_workers                                             # CPU, the tiny target (the test)

The target has the preset's shape and random weights (written from its config: no download), the drafter is a
random 5-layer export of it: τ is then about 1, so every step verifies a whole block, as an early snapshot's do. The
references (the target's greedy decodes) are made once, untimed; each timed row is the drafter's evaluation alone
(the part of the proof's evaluation repeated for every snapshot).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

# name -> (the target's config, decoding settings)
PRESETS = {
    # SmolLM2-135M-Instruct's shape (the proof's target)
    "smollm2-135m": (dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=2048,
                          tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0),
                     dict(num_prompts=16, prompt_len=(40, 160), max_new_tokens=64, block_size=16, draft_layers=5)),
    "tiny-cpu": (dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=512,
                      tie_word_embeddings=False),
                 dict(num_prompts=6, prompt_len=(8, 24), max_new_tokens=12, block_size=4, draft_layers=1)),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny-cpu")
    p.add_argument("--workers", default="1,2", help="comma-separated process counts; the first is the reference")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default: CUDA where there is one)")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    return p


def write_models(root: str, preset: str) -> tuple[str, str, dict]:
    """The random target dir and a random drafter export of it; the decoding settings."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dflash_trainer.export.exporter import export_checkpoint
    from dflash_trainer.loop.checkpoint import save_checkpoint
    from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig

    config, decode = PRESETS[preset]
    torch.manual_seed(0)
    target = os.path.join(root, "target")
    model_type = config["model_type"]
    cfg = AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
    AutoModelForCausalLM.from_config(cfg).save_pretrained(target)
    layers = cfg.num_hidden_layers
    dcfg = DrafterConfig.from_target(cfg, num_layers=decode["draft_layers"],
                                     target_layer_ids=sorted({1, layers // 2, layers - 2}),
                                     block_size=decode["block_size"], mask_token_id=cfg.vocab_size - 1)
    drafter = DFlashDrafter(dcfg)
    step = save_checkpoint(os.path.join(root, "train"), 1, drafter.trainable_state_dict(), dcfg.to_dict(),
                           {"step": 1}, keep=1)
    export = os.path.join(root, "export")
    export_checkpoint(step, target, export, dtype="float32")
    return target, export, decode


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from dflash_trainer.eval.evaluate import evaluate, load_drafter, load_target
    from dflash_trainer.eval.workers import DecodePool

    from .matmul_peak import benchmark_device
    device = benchmark_device(args.device, "eval_workers.py", "use --device cpu")
    counts = [int(w) for w in args.workers.split(",")]
    if not counts or min(counts) < 1:
        print("eval_workers.py: error: --workers takes process counts of at least 1, e.g. 1,2,4", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as root:
        target, export, d = write_models(root, args.preset)
        rng = random.Random(0)
        vocab = PRESETS[args.preset][0]["vocab_size"]
        prompts = [[rng.randrange(vocab - 1) for _ in range(rng.randint(*d["prompt_len"]))]
                   for _ in range(d["num_prompts"])]
        model, _ = load_target(target, device, torch.float32)
        common = dict(block_size=d["block_size"], max_new_tokens=d["max_new_tokens"], eos=set(), baseline=False)
        references = evaluate(model, prompts, **common)["references"]  # untimed
        rows, first = [], None
        for k in counts:
            pool = DecodePool(target, device, torch.float32, k) if k > 1 else None
            try:
                if pool is not None:  # the processes start and load the target before the clock starts
                    evaluate(model, prompts[:k], drafter_path=export, pool=pool, **dict(common, max_new_tokens=2),
                             references=[r[:2] for r in references[:k]])
                t0 = time.perf_counter()
                if pool is None:
                    drafter = load_drafter(export, model, device, torch.float32)
                    report = evaluate(model, prompts, drafter=drafter, references=references, **common)
                else:
                    report = evaluate(model, prompts, drafter_path=export, pool=pool, references=references,
                                      **common)
                seconds = time.perf_counter() - t0
            finally:
                if pool is not None:
                    pool.close()
            m = report["methods"]["dflash"]
            figures = {key: m[key] for key in ("tau", "num_steps", "accept_length_histogram", "lossless")}
            first = first or (seconds, figures)
            rows.append({"workers": k, "seconds": seconds, "steps_per_s": m["num_steps"] / seconds,
                         "speedup": first[0] / seconds, "same_figures": figures == first[1], **figures})
    print(f"device: {device}; target {args.preset} (random weights), drafter {d['draft_layers']} layers (random), "
          f"block {d['block_size']}; {d['num_prompts']} prompts, {d['max_new_tokens']} new tokens each")
    print(f"\n| workers | seconds | verify steps/s | speedup vs {counts[0]} | τ | same figures as {counts[0]} |")
    print("|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['seconds']:.2f} | {r['steps_per_s']:.1f} | {r['speedup']:.2f} | "
              f"{r['tau']:.3f} | {'yes' if r['same_figures'] else 'NO'} |")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"preset": args.preset, "device": str(device), "decode": d, "rows": rows,
                       "torch": torch.__version__}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
