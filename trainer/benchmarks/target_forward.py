"""Time the frozen target's forward as dflash-train runs it, against the peak measured in this process (issue 15).

    python -m benchmarks.target_forward --preset qwen3-8b --out $OUT/target-forward.json   # one H200
    python -m benchmarks.target_forward --preset qwen3-8b --num-layers 12 --profile        # + time per part
    python -m benchmarks.target_forward --preset tiny-cpu                                  # CPU, seconds
    python -m benchmarks.target_forward --preset qwen3.6-27b --target-layers kinds          # the seed's family

The seed's family (--preset qwen3.6-27b: Qwen3.6-27B's text shape, 6 Gated DeltaNet + 2 full-attention layers of
the real size; the 27B has 48 + 16): `--target-layers kinds` times each way of compiling each layer kind
(layer_kinds.STRATEGIES, model/target.py's COMPILE_BY_KIND last), per kind (CUDA events around each layer) and for
the whole forward, and projects the 64-layer model: 48 x its DeltaNet ms + 16 x its full-attention ms + the rest of
the measured forward (embedding, final norm), against its FLOP. The kinds' ms come from forwards with the events in
them, whose layers summed to up to 9.4 % more than the untimed forward (one H200, 2026-12-04): where they exceed it,
they are scaled to it (advisor.layer_timing.fit_to_forward, which dflash-train --plan uses too; both are printed,
with the timed forwards' own time). Each of those timings follows an idle moment, as the peak's products do; each
strategy is also run back to back (timing.back_to_back_s: the forward `--steps` times, then as many seconds of
the peak's products, matmul_peak.measure_sustained_peak), the GPU never idle, as a training run keeps it: on one
H200 (2026-12-05) the forwards took 3.5-6.6 % longer so, and the 64-layer figure at that pace against that peak is
printed beside the other. The `target kernels:` line says which linear-attention code ran (fla, or
transformers' torch fallback when fla does not import).

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
from dflash_trainer.model import target_kernels

from . import layer_kinds
from .matmul_peak import PEAK_N, benchmark_device, describe, measure_peak, measure_sustained_peak
from .pipeline import target_flop_per_token, write_target
from .preset_args import parse_with_preset
from .profile_parts import profile_steps
from .timing import back_to_back_s, device_sync, timed_calls

# dflash-train's flags this benchmark takes (declared, defaulted and checked in config/train_config.py only).
TRAIN_FLAGS = ("device", "num_target_taps", "use_soft_labels")
# Named shapes and runs; a dflash-train command line for TRAIN_FLAGS, given before the user's (which win).
PRESETS = {
    # Qwen3-8B's shape (hidden 4096, 36 layers, 32 heads x 128, 8 KV heads, MLP 12288, vocab 151,936).
    "qwen3-8b": (dict(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, intermediate=12288, vocab=151936,
                      seq_len=8192, batch=1, steps=10, warmup=3), ["--device", "cuda"]),
    # Qwen3.6-27B's text model (Qwen3.5-27B's shape): hidden 5120, 24 heads x 256, 4 KV heads, MLP 17,408, vocab
    # 248,320, Gated DeltaNet heads 16 key / 48 value x 128; every 4th layer full attention. 8 layers (6 + 2) fit a
    # call; full_model: the 27B's layers per kind, for the projection.
    "qwen3.6-27b": (dict(family="qwen3_5", hidden=5120, layers=8, heads=24, kv_heads=4, head_dim=256,
                         intermediate=17408, vocab=248320, linear_key_heads=16, linear_value_heads=48,
                         linear_head_dim=128, seq_len=8192, batch=1, steps=6, warmup=2,
                         full_model={"linear_attention": 48, "full_attention": 16}), ["--device", "cuda"]),
    # The tiny hybrid target (dflash-make-tiny --family qwen3_5's shape; the CPU test of the kinds mode).
    "qwen3.5-tiny-cpu": (dict(family="qwen3_5", hidden=64, layers=8, heads=4, kv_heads=2, head_dim=16,
                              intermediate=128, vocab=512, linear_key_heads=2, linear_value_heads=4,
                              linear_head_dim=16, seq_len=128, batch=1, steps=2, warmup=1,
                              full_model={"linear_attention": 48, "full_attention": 16}), ["--device", "cpu"]),
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
    p.add_argument("--profile", action="store_true", help="after timing, profile a few forwards: time per part "
                                                          "(with --target-layers kinds: per strategy)")
    p.add_argument("--target-layers", choices=["default", "eager", "both", "kinds"], default="default",
                   help="default: as dflash-train runs the target (decoder layers compiled on CUDA unless "
                        "DFLASH_EAGER_TARGET=1); both: eager, then compiled, same process and weights; kinds: "
                        "each of layer_kinds.STRATEGIES, with the time per layer kind (CUDA)")
    p.add_argument("--strategies", default=",".join(layer_kinds.STRATEGIES),
                   help="--target-layers kinds: which of layer_kinds.STRATEGIES, comma-separated (default: all)")
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
    unknown = set(args.strategies.split(",")) - set(layer_kinds.STRATEGIES)
    if unknown:
        build_parser().error(f"--strategies: unknown {', '.join(sorted(unknown))}; choose from "
                             f"{', '.join(layer_kinds.STRATEGIES)}")
    try:  # dflash-train's environment knob, read (and refused in one line) before anything runs
        args.compile_default = cli.env_setting("compile_target")
    except ValueError as exc:
        build_parser().error(str(exc))
    return args, shape, cli.train_settings(args, TRAIN_FLAGS)


def forward_flop(shape: dict, layer_params: int) -> dict:
    """FLOP of one forward of shape["batch"] sequences (module docstring), split into layers and attention."""
    tokens = shape["batch"] * shape["seq_len"]
    # the seed's family: attention FLOP in its full-attention layers only (every 4th), none for Gated DeltaNet
    attn_shape = dict(shape, layers=shape["layers"] // 4) if shape.get("family") == "qwen3_5" else shape
    layers = 2 * layer_params * tokens
    attention = target_flop_per_token(attn_shape, 0, shape["seq_len"]) * tokens
    return {"layers": layers, "attention": attention, "total": layers + attention}


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
        writer = write_hybrid_target if s.get("family") == "qwen3_5" else write_target
        made = writer(torch, os.path.join(work, "target"), {**s}, device)
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
    kernels = target_kernels.describe(target_kernels.found_kernels(),
                                      target_kernels.layer_types(target.config).count("linear_attention"))
    print(f"target kernels: {kernels}", flush=True)
    if args.target_layers == "kinds":
        return run_kinds(args, s, train, target, input_ids, flop, peak, made, layer_ids, kernels, device)
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


def write_hybrid_target(torch, path: str, shape: dict, device) -> dict:
    """A random target of the seed's family (make_tiny.qwen3_5_config at the preset's shape), saved as the 27B is."""
    from dflash_trainer.prep import make_tiny
    config = make_tiny.qwen3_5_config(
        num_layers=shape["layers"], hidden=shape["hidden"], vocab=shape["vocab"], heads=shape["heads"],
        kv_heads=shape["kv_heads"], head_dim=shape["head_dim"], intermediate=shape["intermediate"],
        linear_key_heads=shape["linear_key_heads"], linear_value_heads=shape["linear_value_heads"],
        linear_head_dim=shape["linear_head_dim"], max_positions=max(shape["seq_len"] * 2, 4096),
        initializer_range=0.02)
    model = make_tiny.write_target(path, seed=0, config=config, device=str(device))
    layer_params = sum(p.numel() for p in model.model.language_model.layers.parameters())
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"layer_params": layer_params, "config": config}


def run_kinds(args, s, train, target, input_ids, flop, peak, made, layer_ids, kernels, device) -> int:
    """--target-layers kinds: each strategy's whole forward and time per layer kind, and the 64-layer projection."""
    if device.type != "cuda":  # the per-kind events are CUDA's; on the CPU only the forward runs once (the test)
        taps, _ = target(input_ids)
        print(f"kinds: {len(taps)} taps, {layer_kinds.layer_kinds(target.config, s['layers'])}")
        return 0
    params = layer_kinds.kind_params(target)
    full = s.get("full_model") or {}
    full_flop = sum(n * layer_kinds.layer_flop(s, kind, params[kind]) for kind, n in full.items())
    print(f"FLOP rule: a layer = 2 x its parameters x tokens, + 4 x heads x head_dim x B x T(T+1)/2 for full "
          f"attention (DeltaNet's recurrence not counted); parameters per layer {params}; 64-layer model "
          f"{full} = {full_flop / 1e12:.1f} TFLOP per forward of {s['batch']} x {s['seq_len']} tokens", flush=True)
    rows = []
    for name in args.strategies.split(","):
        by_kind = layer_kinds.STRATEGIES[name]
        layer_kinds.uncompile(target)
        with layer_kinds.kernel_copies(name in layer_kinds.KERNEL_COPIES):
            how = target.compile_layers(by_kind)
        times, _, warm_s = timed_calls(lambda _i: target(input_ids), s["warmup"], s["steps"], device)
        median = times[len(times) // 2]
        # the same forwards with the GPU never idle, against products back to back for as long (see the docstring)
        steady = back_to_back_s(lambda _i: target(input_ids), s["steps"], device)
        peak_n = PEAK_N[device.type]
        sustained = measure_sustained_peak(device, peak_n, max(10, round(steady * s["steps"] * peak["tflops"] * 1e12
                                                                         / (2 * peak_n ** 3))))
        sync, timed_forward_s = device_sync(device), []
        with layer_kinds.TimedLayers(target) as timed:
            for _ in range(3):
                sync()
                t0 = time.perf_counter()
                timed.call(lambda: target(input_ids))  # (synchronizes before it returns)
                timed_forward_s.append(time.perf_counter() - t0)
        events = timed.per_kind()
        events_ms = layer_kinds.events_ms(events)
        per_kind, rest_ms, scale = layer_kinds.fit_to_forward(events, median * 1e3)
        for kind, k in per_kind.items():
            k["tflops"] = layer_kinds.layer_flop(s, kind, params[kind]) / (k["ms_per_layer"] / 1e3) / 1e12
            k["ratio_to_peak"] = k["tflops"] / peak["tflops"]
        row = {"strategy": name, "by_kind": by_kind, "layers": how, "warmup_s": warm_s, "forward_s_median": median,
               "forward_s_all": times, "ratio_to_peak": flop["total"] / median / 1e12 / peak["tflops"],
               "back_to_back": {"forward_s": steady, "peak": sustained,
                                "ratio_to_peak": flop["total"] / steady / 1e12 / sustained["tflops"]},
               "per_kind": per_kind, "rest_ms": rest_ms, "events_ms": events_ms,
               "timed_forward_s": sorted(timed_forward_s), "events_scale": scale}
        if full and all(kind in per_kind for kind in full):
            full_s = (sum(n * per_kind[kind]["ms_per_layer"] for kind, n in full.items()) + rest_ms) / 1e3
            row["full_model"] = {"layers": full, "s_per_forward": full_s, "s_per_sequence": full_s / s["batch"],
                                 "tflops": full_flop / full_s / 1e12,
                                 "ratio_to_peak": full_flop / full_s / 1e12 / peak["tflops"],
                                 # every layer at the back-to-back forward's pace, against the back-to-back peak
                                 "back_to_back_ratio_to_peak": full_flop / (full_s * steady / median) / 1e12
                                 / sustained["tflops"]}
        rows.append(row)
        print_kinds_row(row, peak)
        if args.profile:  # where each strategy's forward goes (e.g. the "copies" part), after its timings
            row["profile"] = profile_steps(lambda _i: target(input_ids), sync, device.type)
    print("\n| strategy | " + " | ".join(f"{k} ms/layer (share of peak)" for k in rows[0]["per_kind"]) +
          " | 64-layer s/seq | share of peak | back to back: share of that peak |")
    for row in rows:
        fm = row.get("full_model", {})
        print(f"| {row['strategy']} | " + " | ".join(
            f"{k['ms_per_layer']:.2f} ({k['ratio_to_peak']:.3f})" for k in row["per_kind"].values()) +
            f" | {fm.get('s_per_sequence', float('nan')):.3f} | {fm.get('ratio_to_peak', float('nan')):.3f} | "
            f"{fm.get('back_to_back_ratio_to_peak', float('nan')):.3f} |")
    result = {"shape": s, "train_flags": train, "target_layer_ids": layer_ids, "layer_params": made["layer_params"],
              "kind_params": params, "device": peak["device"], "peak": peak, "peak_tflops": peak["tflops"],
              "target_kernels": kernels, "tflop_per_forward": {k: v / 1e12 for k, v in flop.items()},
              "full_model_tflop_per_forward": full_flop / 1e12, "strategies": rows,
              "max_memory_gb": torch_max_memory(device)}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def torch_max_memory(device) -> float | None:
    import torch
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None


def print_kinds_row(row: dict, peak: dict) -> None:
    kinds = "; ".join(f"{kind} {k['layers']} x {k['ms_per_layer']:.2f} ms = {k['tflops']:.0f} TFLOP/s "
                      f"({k['ratio_to_peak']:.3f})" for kind, k in row["per_kind"].items())
    fm = row.get("full_model")
    full = (f"; 64-layer model {fm['s_per_sequence']:.3f} s/seq, {fm['tflops']:.0f} TFLOP/s = "
            f"{fm['ratio_to_peak']:.3f} of {peak['tflops']:.1f}") if fm else ""
    b2b = row["back_to_back"]
    full += (f"; back to back: forward {b2b['forward_s'] * 1e3:.1f} ms, {b2b['peak']['calls']} products "
             f"{b2b['peak']['tflops']:.1f} TFLOP/s, forward {b2b['ratio_to_peak']:.3f} of that" +
             (f", 64-layer model {fm['back_to_back_ratio_to_peak']:.3f}" if fm else ""))
    timed_ms = row["timed_forward_s"][len(row["timed_forward_s"]) // 2] * 1e3
    print(f"[{row['strategy']}] {row['layers']}; warm-up {row['warmup_s']:.1f} s; forward "
          f"{row['forward_s_median'] * 1e3:.1f} ms ({row['ratio_to_peak']:.3f} of peak); layers' events "
          f"{row['events_ms']:.1f} ms in timed forwards of {timed_ms:.1f} ms, the kinds scaled by "
          f"{row['events_scale']:.3f} to the forward; {kinds}; rest {row['rest_ms']:.1f} ms{full}", flush=True)


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
