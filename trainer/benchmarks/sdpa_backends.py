"""Which of torch's attention kernels runs the seed family's full-attention layers fastest (issue 31): the causal
attention of one forward at the target's shape, timed per SDPA backend, against the peak measured in this process.

    python -m benchmarks.sdpa_backends --preset qwen3.6-27b     # one H200: 24 query / 4 KV heads x 256, 8,192 tokens
    python -m benchmarks.sdpa_backends                          # CPU, a tiny shape (the test)

The shape is target_forward.py's preset (one declaration). Each backend runs twice: with `enable_gqa` (the 4 KV heads
as they are: what transformers passes when there is no mask) and with the KV heads repeated to the query heads
(transformers' repeat_kv, what runs with a mask). A backend that refuses the inputs is a row saying so. FLOP:
layer_kinds.layer_flop's attention term, 4 x heads x head_dim x B x T(T+1)/2 (causal: QK^T and PV, 2 FLOP per
multiply-add), which target_forward.py counts for a full-attention layer's attention.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from .layer_kinds import layer_flop
from .matmul_peak import PEAK_N, benchmark_device, describe, measure_peak
from .target_forward import PRESETS
from .timing import timed_calls

# "default": no sdpa_kernel context, the kernel torch picks by its own order (what an uncompiled layer gets)
BACKENDS = ("default", "FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="qwen3.5-tiny-cpu",
                   help="the shape, one of target_forward.py's presets (default: qwen3.5-tiny-cpu)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default: CUDA where there is one)")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    return p


def time_backend(torch, backend: str, gqa: bool, shape: dict, device, dtype):
    """(seconds of one causal attention: the median of the preset's steps, its output), or the backend's refusal as
    a string."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, T, H, KV, D = shape["batch"], shape["seq_len"], shape["heads"], shape["kv_heads"], shape["head_dim"]
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, H, T, D, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(B, KV, T, D, device=device, dtype=dtype, generator=g) for _ in range(2))
    if not gqa:
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    F = torch.nn.functional

    def call(_i):
        chosen = contextlib.nullcontext() if backend == "default" else sdpa_kernel(getattr(SDPBackend, backend))
        with chosen, torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    try:
        times, out, _ = timed_calls(call, shape["warmup"], shape["steps"], device)
    except RuntimeError as exc:  # "No available kernel": this backend does not take these inputs
        return str(exc).splitlines()[0][:100]
    return times[len(times) // 2], out


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    device = benchmark_device(args.device, "sdpa_backends.py", "use --device cpu")
    shape = dict(PRESETS[args.preset][0])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = measure_peak(device, PEAK_N[device.type])
    print(f"peak: {describe(peak)}")
    flop = layer_flop(shape, "full_attention", 0)  # a full-attention layer's FLOP less its parameters' share
    print(f"shape: {shape['batch']} x {shape['seq_len']} tokens, {shape['heads']} query / {shape['kv_heads']} KV "
          f"heads x {shape['head_dim']}, causal, {str(dtype).replace('torch.', '')}; {flop / 1e12:.3f} TFLOP per call")
    rows, first = [], None
    for backend in BACKENDS if device.type == "cuda" else ("default", "MATH"):
        for gqa in (True, False):
            timed = time_backend(torch, backend, gqa, shape, device, dtype)
            row = {"backend": backend, "kv": "enable_gqa" if gqa else "repeated"}
            if isinstance(timed, str):
                row["refused"] = timed
            else:
                s, out = timed
                first = out if first is None else first  # the same inputs: the outputs must agree
                row.update({"ms": s * 1e3, "tflops": flop / s / 1e12, "ratio_to_peak": flop / s / 1e12 / peak["tflops"],
                            "max_abs_diff": (out.float() - first.float()).abs().max().item()})
                del out
            rows.append(row)
    measured = [r for r in rows if "ms" in r]
    reference = min(r["ms"] for r in measured if r["backend"] == measured[0]["backend"])
    print(f"\n| backend | KV heads | ms | TFLOP/s | share of peak | time / {measured[0]['backend']}'s best | "
          f"max abs diff to the first row's output |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "ms" in r:
            print(f"| {r['backend']} | {r['kv']} | {r['ms']:.3f} | {r['tflops']:.1f} | {r['ratio_to_peak']:.3f} | "
                  f"{r['ms'] / reference:.2f} | {r['max_abs_diff']:.3g} |")
        else:
            print(f"| {r['backend']} | {r['kv']} | refused: {r['refused']} | | | | |")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"shape": shape, "peak": peak, "tflop_per_call": flop / 1e12, "rows": rows,
                       "torch": torch.__version__}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
