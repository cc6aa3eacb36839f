"""Flex attention's kernel options for the drafter's attention, measured at a train_step.py preset's shape.

The drafter's attention (every block query sees its anchor's context prefix and its own block) is the product's:
anchors from blocks.sample_anchors, the mask from blocks.build_mask, the call through drafter.attend with
each candidate's kernel_options (candidate "product": attend's default, drafter.flex_kernel_options). Each
candidate is compiled on its own; forward and forward + backward are timed, and the output and the query
gradient are compared with torch's default tiles (the first candidate):

    python -m benchmarks.attention_kernels --preset h200-27b --out attention.json        # one H200
    python -m benchmarks.attention_kernels --preset tiny-cpu   # CPU: SDPA and a dense mask, as the
                                                                       # product runs there (options unused)

Useful FLOP as train_step.py counts them: forward 4 x visible (query, key) pairs x heads x head_dim, backward
twice that (the recomputed scores not counted).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from dflash_trainer import cli
from dflash_trainer.model.blocks import build_mask, sample_anchors
from dflash_trainer.model.drafter import attend
from .matmul_peak import benchmark_device
from .preset_args import parse_with_preset
from .timing import timed_calls
from .train_step import PRESETS, TRAIN_FLAGS


def _bwd(m1, n1, m2, n2, warps, stages) -> dict:
    return {"bwd_BLOCK_M1": m1, "bwd_BLOCK_N1": n1, "bwd_BLOCK_M2": m2, "bwd_BLOCK_N2": n2,
            "bwd_num_warps": warps, "bwd_num_stages": stages}


def _fwd(m, n, warps, stages) -> dict:
    return {"fwd_BLOCK_M": m, "fwd_BLOCK_N": n, "fwd_num_warps": warps, "fwd_num_stages": stages}


# Tiles to try (torch's own for head_dim 256 on sm90: forward 64x32, 4 warps, 3 stages; backward 64x64 all four,
# 4 warps, 2 stages). Forward and backward options are independent, so each candidate changes one side.
CANDIDATES = {
    "torch default": {},
    "product": None,
    "safe rows": {"ROWS_GUARANTEED_SAFE": True},  # every query sees at least its own block
    "fwd 128x64 w8 s2": _fwd(128, 64, 8, 2),
    "fwd 128x32 w8 s2": _fwd(128, 32, 8, 2),
    "fwd 64x64 w4 s2": _fwd(64, 64, 4, 2),
    "bwd 64x64 w8 s2": _bwd(64, 64, 64, 64, 8, 2),
    "bwd 64x64 w8 s1": _bwd(64, 64, 64, 64, 8, 1),
    "bwd 32x64 w4 s2": _bwd(32, 64, 64, 32, 4, 2),
    "bwd 32x64 w8 s2": _bwd(32, 64, 64, 32, 8, 2),
    "bwd 32x128 w8 s2": _bwd(32, 128, 128, 32, 8, 2),
    "bwd 64x128 w8 s2": _bwd(64, 128, 128, 64, 8, 2),
    "bwd 32x32 w4 s3": _bwd(32, 32, 32, 32, 4, 3),
    "bwd 16x64 w4 s3": _bwd(16, 64, 64, 16, 4, 3),
    "bwd 64x64 w8 s3": _bwd(64, 64, 64, 64, 8, 3),
    "bwd 64/64/128/64 w8 s2": _bwd(64, 64, 128, 64, 8, 2),
    "bwd 64/64/64/32 w8 s2": _bwd(64, 64, 64, 32, 8, 2),
    "bwd 32x64 w8 s3": _bwd(32, 64, 64, 32, 8, 3),
    "bwd 64x64 w8 s2 tma": {**_bwd(64, 64, 64, 64, 8, 2), "USE_TMA": True},
    "bwd 64x64 w8 s2 dkv-dq": {**_bwd(64, 64, 64, 64, 8, 2), "WRITE_DQ": False},
    "fwd 128x64 w8 s3": _fwd(128, 64, 8, 3),
    "fwd 128x64 w8 s1": _fwd(128, 64, 8, 1),
    "fwd 128x128 w8 s2": _fwd(128, 128, 8, 2),
    "fwd 128x64 w8 s2 tma": {**_fwd(128, 64, 8, 2), "USE_TMA": True},
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="train_step.py's shape (default tiny-cpu)")
    p.add_argument("--candidates", default=",".join(CANDIDATES),
                   help=f"comma-separated names, in order (default all: {', '.join(CANDIDATES)})")
    p.add_argument("--steps", type=int, default=5, help="timed calls per candidate and pass")
    p.add_argument("--time-limit", type=float, default=480.0,
                   help="seconds; no new candidate starts after this (each compiles its own kernels)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    cli.add_train_flags(p, only=TRAIN_FLAGS)  # train_step's, so its presets parse; the attention reads three
    return p


def attention_inputs(shape: dict, block_size: int, max_anchors: int, device):
    """Random q, k, v (bf16 on CUDA) at the drafter's shapes and the product's mask over sorted anchors."""
    B, T, H, KV, d = shape["batch"], shape["seq_len"], shape["heads"], shape["kv_heads"], shape["head_dim"]
    anchors, valid = sample_anchors(torch.ones(B, T, dtype=torch.bool), max_anchors, torch.Generator().manual_seed(0))
    anchors, valid = anchors.to(device), valid.to(device)
    Q = anchors.shape[1] * block_size
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(B, H, Q, d, device=device, dtype=dtype, generator=gen)
    k, v = (torch.randn(B, KV, T + Q, d, device=device, dtype=dtype, generator=gen) for _ in range(2))
    grad = torch.randn(B, H, Q, d, device=device, dtype=dtype, generator=gen)
    mask = build_mask(anchors, valid, T, block_size, use_flex=device.type == "cuda")  # as drafter_micro_batch
    pairs = int(((anchors + block_size) * block_size * valid).sum())
    return (q, k, v, grad, mask), 4 * pairs * H * d


def measure(options, inputs, steps: int, device) -> dict:
    q, k, v, grad, mask = inputs
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))

    def call(q, k, v):
        return attend(q, k, v, mask, kernel_options=options)

    fn = torch.compile(call) if device.type == "cuda" else call
    t0 = time.perf_counter()
    out = fn(q, k, v)
    out.backward(grad)
    compile_s = time.perf_counter() - t0
    out_ref, dq_ref = out.detach(), q.grad.detach().clone()
    fwd, _, _ = timed_calls(lambda i: fn(q, k, v), 1, steps, device)

    def fwd_bwd(i):
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(grad)

    both, _, _ = timed_calls(fwd_bwd, 1, steps, device)
    fwd_s, both_s = fwd[len(fwd) // 2], both[len(both) // 2]
    return {"compile_s": compile_s, "fwd_s": fwd_s, "bwd_s": max(both_s - fwd_s, 0.0), "out": out_ref, "dq": dq_ref}


def main(argv=None) -> int:
    args, preset = parse_with_preset(build_parser, lambda name: PRESETS[name or "tiny-cpu"][1], argv)
    train = cli.train_settings(args, ("device", "block_size", "max_anchors"))
    names = [n.strip() for n in args.candidates.split(",") if n.strip()]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown or not names:
        print(f"attention_kernels.py: unknown candidate(s) {unknown or names}; choose from {', '.join(CANDIDATES)}",
              file=sys.stderr)
        return 2
    device = benchmark_device(train["device"], "attention_kernels.py", "pass --device cpu")
    shape = PRESETS[preset or "tiny-cpu"][0]
    inputs, fwd_flop = attention_inputs(shape, train["block_size"], train["max_anchors"], device)
    print(f"shape: batch {shape['batch']} context {shape['seq_len']} heads {shape['heads']}/{shape['kv_heads']} x "
          f"{shape['head_dim']}, block {train['block_size']}, anchors {train['max_anchors']}, queries "
          f"{inputs[0].shape[2]}; forward {fwd_flop / 1e12:.3g} TFLOP (backward twice that)")
    print(f"{'candidate':<24} {'compile s':>9} {'fwd ms':>8} {'bwd ms':>8} {'fwd TF/s':>9} {'bwd TF/s':>9} "
          f"{'fwd+bwd':>8} {'x ref':>6} {'max|dout|':>9} {'max|dq|':>9}")
    results, ref, start = [], None, time.perf_counter()
    for name in names:
        if time.perf_counter() - start > args.time_limit:
            print(f"{name:<24} not run: --time-limit {args.time_limit:g} s passed")
            results.append({"candidate": name, "skipped": "time limit"})
            continue
        options = CANDIDATES[name]
        torch._dynamo.reset()
        try:
            r = measure(options, inputs, args.steps, device)
        except Exception as exc:  # a tile that does not fit (shared memory, registers) fails to compile
            line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
            print(f"{name:<24} failed: {line}")
            results.append({"candidate": name, "options": options, "error": line})
            continue
        ref = ref or r
        total = r["fwd_s"] + r["bwd_s"]
        dout = (r["out"].float() - ref["out"].float()).abs().max().item()
        ddq = (r["dq"].float() - ref["dq"].float()).abs().max().item()
        row = {"candidate": name, "options": options, "compile_s": r["compile_s"], "fwd_s": r["fwd_s"],
               "bwd_s": r["bwd_s"], "fwd_tflops": fwd_flop / r["fwd_s"] / 1e12,
               "bwd_tflops": 2 * fwd_flop / max(r["bwd_s"], 1e-9) / 1e12,
               "speedup_vs_first": (ref["fwd_s"] + ref["bwd_s"]) / total, "max_abs_diff_out": dout,
               "max_abs_diff_dq": ddq}
        results.append(row)
        print(f"{name:<24} {r['compile_s']:9.1f} {r['fwd_s'] * 1e3:8.2f} {r['bwd_s'] * 1e3:8.2f} "
              f"{row['fwd_tflops']:9.1f} {row['bwd_tflops']:9.1f} {total * 1e3:8.2f} {row['speedup_vs_first']:6.2f} "
              f"{dout:9.2g} {ddq:9.2g}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": str(device), "shape": shape, "train": train, "fwd_flop": fwd_flop,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
