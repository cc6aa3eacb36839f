"""Time one DFlash drafter training step (forward + backward + AdamW) and compare with the hardware peak.

No target model is needed: the drafter is built from its config, with random frozen embed_tokens /
lm_head and random target features, so the 27B target's drafter shape runs on one H200:

    python -m benchmarks.train_step --preset h200-27b --out results.json
    python -m benchmarks.train_step --preset h200-27b --profile   # + time per part (issue 15)
    python -m benchmarks.train_step --preset tiny-cpu            # the CPU demo shape
    python -m benchmarks.train_step --hidden 4096 --num-draft-layers 5 --vocab 151936 --device cuda ...

The drafter's settings are dflash-train's own flags (--block-size, --max-anchors, --num-draft-layers,
--num-target-taps, --gamma, --lr, --head-chunk-size, --use-soft-labels, ...), with dflash-train's defaults.

The step is the trainer's own code (dflash_trainer.loop.step.drafter_micro_batch): on CUDA bf16 autocast,
compiled flex_attention with a create_block_mask block mask, the frozen head chunked --head-chunk-size rows
at a time. FLOPs (training = forward + backward):
  layers    3 x 2 x (Q x (q,o,MLP params) + (T+Q) x (k,v params)) per layer, + fc 3 x 2 x T x K*H x H
  attention 3 x 4 x visible (query, key) pairs x heads x head_dim   (no recomputation counted)
  head      2 x 2 x rows x V x H  (forward + input gradient; the head is frozen: no weight gradient)
with Q = anchors x block query positions, T context positions, rows = supervised block slots.

The peak it divides by is measured in the same process first (matmul_peak.py: best of ten 8192^3 bf16 products
on CUDA, 512^3 fp32 on the CPU). --profile then runs torch.profiler over a few more steps and prints the time per
part (profile_parts.py: linears, attention, norms/elementwise, head + loss, optimizer, copies, other, host gaps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from dflash_trainer import cli
from dflash_trainer.model.blocks import sample_anchors
from dflash_trainer.config import check_fp8_setting
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.loss import head_chunk_rows
from dflash_trainer.loop.optimizer import drafter_adamw
from dflash_trainer.loop.step import derived_seed, drafter_micro_batch
from dflash_trainer.loop.train import prepare_drafter

from .matmul_peak import PEAK_N, benchmark_device, describe, measure_peak
from .preset_args import parse_with_preset
from .profile_parts import PROFILE_STEPS, profile_steps
from .timing import device_sync, timed_calls

# The trainer flags this benchmark takes: dflash-train's own (declaration, defaults and checks in config/train_config.py).
TRAIN_FLAGS = ("device", "block_size", "max_anchors", "num_draft_layers", "draft_intermediate_size", "num_target_taps",
               "gamma", "lr", "weight_decay", "grad_clip", "noise_end", "head_chunk_size", "use_soft_labels",
               "soft_label_temperature")
# Named shapes: the model's (no target is loaded, so its shape is given here) and a dflash-train command line
# for the drafter's flags, given before the user's (which win); without --preset, tiny-cpu. A flag that
# neither sets has dflash-train's default.
PRESETS = {
    # A Qwen3.5-27B-like target (hidden 5120, vocab 248,320), the seed run's drafter (dflash-train's defaults).
    "h200-27b": (dict(hidden=5120, heads=24, kv_heads=4, head_dim=256, intermediate=17408, vocab=248320,
                      seq_len=8192, batch=1, steps=5, warmup=3), ["--device", "cuda"]),
    # The SmolLM2-135M proof (hidden 576, vocab 49,152): block 16, 64 sequences of ~320 tokens.
    "smollm2": (dict(hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152, seq_len=320,
                     batch=64, steps=10, warmup=3), ["--device", "cuda", "--block-size", "16", "--max-anchors", "256"]),
    # The CPU demo shape (dflash-make-tiny target, README demo flags).
    "tiny-cpu": (dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512, seq_len=256,
                      batch=8, steps=10, warmup=2),
                 ["--device", "cpu", "--block-size", "8", "--max-anchors", "64", "--num-draft-layers", "2"]),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a named shape; flags override it")
    g = p.add_argument_group("shape of the random model and batch (default: the preset's, else tiny-cpu's)")
    for name in ("hidden", "heads", "kv-heads", "head-dim", "intermediate", "vocab", "seq-len", "batch", "steps",
                 "warmup"):
        g.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--no-compile", action="store_true", help="eager layers on CUDA (default: torch.compile)")
    p.add_argument("--profile", action="store_true",
                   help=f"after timing, profile {PROFILE_STEPS} more steps: time per part and the top kernels")
    p.add_argument("--both-labels", action="store_true",
                   help="time hard labels, then soft (KL to a target distribution; the target's last hidden "
                        "state is random here) in the same process")
    p.add_argument("--head-loss", choices=["default", "eager", "both"], default="default",
                   help="both: time the eager chunked head loss, then the default (compiled on CUDA), same process")
    cli.add_train_flags(p, only=TRAIN_FLAGS)
    return p


def parse_args(argv):
    """(args, shape, train): train holds the TRAIN_FLAGS values, dflash-train's defaults where not given."""
    args, preset = parse_with_preset(build_parser, lambda name: PRESETS[name or "tiny-cpu"][1], argv)
    shape = dict(PRESETS[preset or "tiny-cpu"][0])
    for key in list(shape):
        value = getattr(args, key.replace("-", "_"), None)
        if value is not None:
            shape[key] = value
    try:  # dflash-train's environment knob, read (and refused in one line) before anything runs
        args.fp8_setting = cli.env_setting("fp8_layers")
        check_fp8_setting(args.fp8_setting)  # as dflash-train refuses a forced recipe without torchao
    except ValueError as exc:
        build_parser().error(str(exc))
    return args, shape, cli.train_settings(args, TRAIN_FLAGS)


def flop_estimate(cfg: DrafterConfig, T: int, anchors: torch.Tensor, valid: torch.Tensor, rows: int) -> dict:
    H, S, d = cfg.hidden_size, cfg.block_size, cfg.head_dim
    Q = anchors.shape[0] * anchors.shape[1] * S
    ctx = anchors.shape[0] * T
    qo = 2 * H * cfg.num_attention_heads * d
    kv = 2 * H * cfg.num_key_value_heads * d
    mlp = 3 * H * cfg.intermediate_size
    layer_fwd = cfg.num_hidden_layers * 2 * (Q * (qo + mlp) + (ctx + Q) * kv) + 2 * ctx * cfg.num_taps * H * H
    pairs = int((((anchors + S) * S) * valid).sum())           # each query: a context keys + S block keys
    attn_fwd = cfg.num_hidden_layers * 4 * pairs * cfg.num_attention_heads * d
    head = 2 * 2 * rows * cfg.vocab_size * H
    return {"layers": 3 * layer_fwd, "attention": 3 * attn_fwd, "head": head,
            "total": 3 * layer_fwd + 3 * attn_fwd + head}


def print_result(result: dict) -> None:
    s, flops = result["shape"], result["tflop_per_step"]
    median, tflops = result["step_s_median"], result["achieved_tflops"]
    rows = [("device", result["device"]),
            ("variant", f"{result['labels']} labels, {result['head_loss']} head loss, "
                        f"{'FP8 ' + result['fp8_layers'] if result['fp8_layers'] else 'bf16'} layer linears, "
                        f"head chunk {result['head_chunk_rows']} rows"),
            ("shape", f"hidden {s['hidden']} MLP {s['draft_intermediate_size'] or s['intermediate']} layers "
                      f"{s['num_draft_layers']} block {s['block_size']} anchors "
                      f"{s['max_anchors']} vocab {s['vocab']} seq {s['seq_len']} batch {s['batch']}"),
            ("trainable params", f"{result['trainable_params'] / 1e6:.1f} M"),
            ("step time (median)", f"{median * 1e3:.1f} ms   ({1 / median:.2f} steps/s)"),
            ("TFLOP/step layers", f"{flops['layers']:.4g}"),
            ("TFLOP/step attention", f"{flops['attention']:.4g}"),
            ("TFLOP/step head", f"{flops['head']:.4g}"),
            ("achieved TFLOP/s", f"{tflops:.4g}"),
            ("measured peak", describe(result["peak"])),
            ("share of measured peak", f"{result['ratio_to_peak']:.4g}")]
    if "max_memory_gb" in result:
        rows.append(("peak memory", f"{result['max_memory_gb']:.1f} GB ({result['resting_memory_gb']:.1f} GB between "
                                    f"steps: weights, optimizer state, frozen tables)"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main(argv=None) -> int:
    args, s, train = parse_args(argv)
    device = benchmark_device(train["device"], "train_step.py", "use --preset tiny-cpu or --device cpu")
    peak = measure_peak(device, PEAK_N[device.type])  # before the model: its memory is given back
    print(f"peak: {describe(peak)}", flush=True)
    torch.manual_seed(0)
    num_target_layers = 64
    cfg = DrafterConfig(hidden_size=s["hidden"], num_hidden_layers=train["num_draft_layers"], num_attention_heads=s["heads"],
                        num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
                        intermediate_size=train["draft_intermediate_size"] or s["intermediate"],
                        vocab_size=s["vocab"],
                        target_layer_ids=list(range(1, 1 + train["num_target_taps"])), num_target_layers=num_target_layers,
                        block_size=train["block_size"], mask_token_id=s["vocab"] - 1)
    frozen_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        drafter = DFlashDrafter(cfg)
    # as dflash-train prepares it: bf16 frozen tables, DFLASH_FP8_LAYERS (default auto), compiled layers
    fp8, linears = prepare_drafter(drafter, device, not args.no_compile, args.fp8_setting)
    print(f"drafter linears: {linears}", flush=True)
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = drafter_adamw(trainable, train["lr"], train["weight_decay"], device)

    B, T = s["batch"], s["seq_len"]
    input_ids = torch.randint(0, s["vocab"] - 1, (B, T))
    loss_mask = torch.ones(B, T, dtype=torch.bool)
    lengths = torch.full((B,), T)
    taps = [torch.randn(B, T, s["hidden"], device=device, dtype=frozen_dtype) for _ in range(train["num_target_taps"])]
    last = torch.randn(B, T, s["hidden"], device=device, dtype=frozen_dtype)
    labels = ["hard", "soft"] if args.both_labels else ["soft" if train["use_soft_labels"] else "hard"]
    losses = ["eager", "default"] if args.head_loss == "both" else [args.head_loss]
    variants = [(lab, hl) for lab in labels for hl in losses]
    state = {"variant": variants[0]}

    def micro_batch(label, head_loss, seed, noise):
        os.environ["DFLASH_EAGER_HEAD_LOSS"] = "1" if head_loss == "eager" else "0"
        return drafter_micro_batch(drafter, taps, last if label == "soft" else None, input_ids, loss_mask, lengths,
                                   max_anchors=train["max_anchors"], gamma=train["gamma"], noise_amplitude=noise,
                                   seed=seed, head_chunk_size=train["head_chunk_size"],
                                   soft_label_temperature=train["soft_label_temperature"])

    def step(i):
        out = micro_batch(*state["variant"], seed=derived_seed(0, i), noise=train["noise_end"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, train["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out

    def loss_and_grads(label, head_loss):
        """Loss and flattened gradient of one fixed micro-batch, without an optimizer step."""
        out = micro_batch(label, head_loss, seed=123, noise=0.0)
        out.loss.backward()
        grad = torch.cat([p.grad.flatten().float() for p in trainable if p.grad is not None])
        optimizer.zero_grad(set_to_none=True)
        return float(out.loss.detach()), grad

    agreement = {}
    if args.head_loss == "both":  # the fused loss must give the eager loss and gradient (bf16 rounding aside)
        for label in labels:
            l_e, g_e = loss_and_grads(label, "eager")
            l_c, g_c = loss_and_grads(label, "default")
            agreement[label] = {"loss_eager": l_e, "loss_default": l_c,
                                "grad_rel_diff": float((g_e - g_c).norm() / g_e.norm().clamp(min=1e-30))}
            print(f"agreement {label}: loss eager {l_e:.6f} default {l_c:.6f}, "
                  f"|grad diff|/|grad| {agreement[label]['grad_rel_diff']:.2e}")

    anchors, valid = sample_anchors(loss_mask, train["max_anchors"], torch.Generator().manual_seed(0))
    results, reference = [], None
    for variant in variants:
        state["variant"] = variant
        # the warm-up compiles flex_attention, create_block_mask and the head loss, and sizes the allocator
        times, out, warm_s = timed_calls(step, s["warmup"], s["steps"], device)
        median = times[len(times) // 2]
        reference = reference or median
        flops = flop_estimate(cfg, T, anchors, valid, out.num_rows)
        if variant[0] == "soft":
            flops["head"] = flops["head"] * 3 // 2   # + the target distribution's head matmul
            flops["total"] = flops["layers"] + flops["attention"] + flops["head"]
        tflops = flops["total"] / median / 1e12
        result = {"labels": variant[0], "head_loss": variant[1], "fp8_layers": fp8, "shape": {**s, **train},
                  "head_chunk_rows": head_chunk_rows(cfg.vocab_size, train["head_chunk_size"]),
                  "warmup_s": warm_s,
                  "agreement_with_eager": agreement.get(variant[0]),
                  "compiled_layers": device.type == "cuda" and not args.no_compile,
                  "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  "trainable_params": sum(p.numel() for p in trainable), "step_s_median": median,
                  "step_s_all": times, "steps_per_s": 1 / median, "ratio_to_first": median / reference,
                  "tflop_per_step": {k: v / 1e12 for k, v in flops.items()}, "achieved_tflops": tflops,
                  "peak": peak, "peak_tflops": peak["tflops"], "ratio_to_peak": tflops / peak["tflops"],
                  "loss": float(out.loss.detach()), "block_tokens_per_s": B * anchors.shape[1] * train["block_size"] / median}
        if device.type == "cuda":
            result["max_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
            # between steps: weights, optimizer state, frozen tables (no gradients, no activations)
            result["resting_memory_gb"] = torch.cuda.memory_allocated(device) / 1e9
        results.append(result)
        print_result(result)
    if len(results) > 1:
        print(f"{'labels':<6} {'head loss':<9} {'step ms':>8} {'steps/s':>8} {'x first':>8} {'TFLOP/s':>8} {'warm-up s':>9}")
        for r in results:
            print(f"{r['labels']:<6} {r['head_loss']:<9} {r['step_s_median'] * 1e3:8.1f} {r['steps_per_s']:8.2f} "
                  f"{r['ratio_to_first']:8.3f} {r['achieved_tflops']:8.1f} {r['warmup_s']:9.1f}")
    if args.profile:
        part_flop = {"linears": flops["layers"], "attention": flops["attention"], "head + loss": flops["head"]}
        results[-1]["profile"] = profile_steps(lambda i: step(10_000 + i), device_sync(device), device.type, part_flop)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results[0] if len(results) == 1 else results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
