"""Time the frozen target's forward as dflash-train runs it, against the peak measured in this process (issue 15).

    python -m benchmarks.target_forward --preset qwen3-8b --out $OUT/target-forward.json   # one H200
    python -m benchmarks.target_forward --preset qwen3-8b --num-layers 12 --profile        # + time per part
    python -m benchmarks.target_forward --preset tiny-cpu                                  # CPU, seconds

The target has random weights: a transformers Qwen3Config / Qwen3ForCausalLM of the preset's shape, written with
save_pretrained (pipeline.write_target) and loaded by dflash_trainer.model.target.FrozenTarget exactly as dflash-train
loads --target-model (bf16 on CUDA, transformers' default attention). Each timed call is FrozenTarget's own
forward on random ids: every hidden state kept (output_hidden_states), the taps returned, no logits (it runs the
base model, not the head). A separate script, not a mode of train_step.py: another model, another loop, and
train_step.py's flags are the drafter's.

FLOP per forward (pipeline.target_flop_per_token x tokens, the figure pipeline.py reports for the target stage):
  layers     2 x P x B x T                              P = parameters of the decoder layers (no embedding/head)
  attention  4 x L x heads x head_dim x B x T(T+1)/2    causal: query i sees i+1 keys; QK^T and PV, 2 FLOP each
with L layers, B sequences of T tokens. The layers are identical, so --num-layers (fewer layers of the same
shape, to save load time and memory) leaves TFLOP/s, the figure that matters, unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from dflash_trainer import cli
from dflash_trainer.config import default_target_layer_ids

from .matmul_peak import PEAK_N, benchmark_device, describe, measure_peak
from .pipeline import target_flop_per_token, write_target
from .preset_args import parse_with_preset
from .profile_parts import profile_steps
from .timing import device_sync, timed_calls

# dflash-train's flags this benchmark takes (declared, defaulted and checked in config/train_config.py only).
TRAIN_FLAGS = ("device", "num_target_taps", "use_soft_labels")
# Named shapes and runs; a dflash-train command line for TRAIN_FLAGS, given before the user's (which win).
PRESETS = {
    # Qwen3-8B's shape (hidden 4096, 36 layers, 32 heads x 128, 8 KV heads, MLP 12288, vocab 151,936).
    "qwen3-8b": (dict(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, intermediate=12288, vocab=151936,
                      seq_len=8192, batch=1, steps=10, warmup=3), ["--device", "cuda"]),
    # The dflash-make-tiny target's shape (the CPU demo and tests).
    "tiny-cpu": (dict(hidden=64, layers=8, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
                      seq_len=256, batch=2, steps=3, warmup=1), ["--device", "cpu"]),
}
OVERRIDES = ("num-layers", "seq-len", "batch", "steps", "warmup")  # flag -> shape key (num-layers -> layers)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a named shape (default: tiny-cpu)")
    g = p.add_argument_group("overrides of the preset")
    for name in OVERRIDES:
        g.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--profile", action="store_true", help="after timing, profile a few forwards: time per part")
    p.add_argument("--target-layers", choices=["default", "eager", "both"], default="default",
                   help="default: as dflash-train runs the target (decoder layers compiled on CUDA unless "
                        "DFLASH_EAGER_TARGET=1); both: eager, then compiled, same process and weights")
    p.add_argument("--work-dir", default=None, help="where the random target is written (default: a temporary "
                                                    "dir, removed once loaded)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    cli.add_train_flags(p, only=TRAIN_FLAGS)
    return p


def parse_args(argv):
    """(args, shape, train): train holds the TRAIN_FLAGS values, dflash-train's defaults where not given."""
    args, preset = parse_with_preset(build_parser, lambda name: PRESETS[name or "tiny-cpu"][1], argv)
    shape = dict(PRESETS[preset or "tiny-cpu"][0])
    for name in OVERRIDES:
        value = getattr(args, name.replace("-", "_"))
        if value is not None:
            if value < 1:
                print(f"target_forward.py: error: --{name} is {value}; it must be at least 1", file=sys.stderr)
                raise SystemExit(2)
            shape["layers" if name == "num-layers" else name.replace("-", "_")] = value
    try:  # dflash-train's environment knob, read (and refused in one line) before anything runs
        args.compile_default = cli.env_setting("compile_target")
    except ValueError as exc:
        build_parser().error(str(exc))
    return args, shape, cli.train_settings(args, TRAIN_FLAGS)


def forward_flop(shape: dict, layer_params: int) -> dict:
    """FLOP of one forward of shape["batch"] sequences (module docstring), split into layers and attention."""
    tokens = shape["batch"] * shape["seq_len"]
    total = target_flop_per_token(shape, layer_params, shape["seq_len"]) * tokens
    layers = 2 * layer_params * tokens
    return {"layers": layers, "attention": total - layers, "total": total}


def main(argv=None) -> int:
    args, s, train = parse_args(argv)
    import torch
    from dflash_trainer.model.target import FrozenTarget

    device = benchmark_device(train["device"], "target_forward.py", "use --preset tiny-cpu")
    try:  # dflash-train's own rule and refusal, before anything is written
        layer_ids = default_target_layer_ids(s["layers"], train["num_target_taps"])
    except ValueError:
        print(f"target_forward.py: error: {s['layers']} layers are too few for dflash-train's default taps "
              f"(layers 1..L-3); pass --num-layers 4 or more", file=sys.stderr)
        return 2
    peak = measure_peak(device, PEAK_N[device.type])  # before the model: its memory is given back
    print(f"peak: {describe(peak)}", flush=True)

    work = args.work_dir or tempfile.mkdtemp(prefix="dflash-target-forward-")
    try:
        t0 = time.perf_counter()
        made = write_target(torch, os.path.join(work, "target"), {**s}, device)
        target = FrozenTarget(os.path.join(work, "target"), device, layer_ids,
                              need_last_hidden=train["use_soft_labels"])
        load_s = time.perf_counter() - t0
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"target: {s['layers']} layers, hidden {s['hidden']}, {made['layer_params'] / 1e9:.3g} B parameters in "
          f"the layers, random, written and loaded in {load_s:.0f} s; taps {layer_ids}", flush=True)

    B, T = s["batch"], s["seq_len"]
    input_ids = torch.randint(0, s["vocab"] - 1, (B, T), generator=torch.Generator().manual_seed(0))
    flop = forward_flop(s, made["layer_params"])
    # as dflash-train runs the target (DFLASH_EAGER_TARGET)
    variants = {"both": [False, True], "eager": [False], "default": [args.compile_default]}[args.target_layers]
    results = []
    for compiled in variants:
        how = target.compile_layers() if compiled else "eager"  # as dflash-train does (eager off CUDA)
        times, (taps, last), warm_s = timed_calls(lambda _i: target(input_ids), s["warmup"], s["steps"], device)
        median = times[len(times) // 2]
        tflops = flop["total"] / median / 1e12
        result = {"shape": s, "train_flags": train, "target_layer_ids": layer_ids,
                  "layer_params": made["layer_params"], "device": peak["device"],
                  "dtype": str(target.model.dtype).replace("torch.", ""),
                  "attention": getattr(target.config, "_attn_implementation", None),
                  "layers": how, "warmup_s": warm_s,
                  "taps": [list(t.shape) for t in taps], "last_hidden": None if last is None else list(last.shape),
                  "forward_s_median": median, "forward_s_all": times, "tokens_per_s": B * T / median,
                  "tflop_per_forward": {k: v / 1e12 for k, v in flop.items()}, "achieved_tflops": tflops,
                  "peak": peak, "peak_tflops": peak["tflops"], "ratio_to_peak": tflops / peak["tflops"]}
        if device.type == "cuda":
            result["max_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        print_result(result, B, T)
        results.append(result)
    if len(results) == 2 and results[1]["layers"].startswith("compiled"):
        print(f"compiled / eager forward time: {results[1]['forward_s_median'] / results[0]['forward_s_median']:.3f}")
    result = {**results[-1], "variants": results}
    if args.profile:
        part_flop = {"linears": flop["layers"], "attention": flop["attention"]}
        result["profile"] = profile_steps(lambda i: target(input_ids), device_sync(device), device.type, part_flop)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def print_result(result: dict, B: int, T: int) -> None:
    s, flop = result["shape"], result["tflop_per_forward"]
    rows = [("device", f"{result['device']}, {result['dtype']}, attention {result['attention']}"),
            ("shape", f"hidden {s['hidden']} layers {s['layers']} heads {s['heads']}x{s['head_dim']} kv "
                      f"{s['kv_heads']} MLP {s['intermediate']} seq {T} batch {B}"),
            ("decoder layers", f"{result['layers']} (warm-up {result['warmup_s']:.1f} s)"),
            ("forward (median)", f"{result['forward_s_median'] * 1e3:.1f} ms of {len(result['forward_s_all'])}, "
                                 f"{len(result['taps'])} taps"),
            ("tokens/s", f"{result['tokens_per_s']:.1f}"),
            ("TFLOP/forward", f"{flop['total']:.4g} (layers {flop['layers']:.4g}, attention {flop['attention']:.4g})"),
            ("achieved TFLOP/s", f"{result['achieved_tflops']:.4g}"),
            ("measured peak", describe(result["peak"])),
            ("share of measured peak", f"{result['ratio_to_peak']:.4g}")]
    if "max_memory_gb" in result:
        rows.append(("peak memory", f"{result['max_memory_gb']:.1f} GB"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    sys.exit(main())
