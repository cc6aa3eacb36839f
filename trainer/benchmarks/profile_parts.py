"""Where a step's time goes: torch.profiler events grouped into parts by name (issue 15).

Each timed item is a (name, ancestors, seconds): on CUDA a GPU kernel (or memcpy/memset), its ancestors the CPU
ops around its launch (innermost first); on the CPU an op's self time, its ancestors its enclosing ops. The part
is decided by the first rule that matches, so that the frozen head's matmuls (launched inside the loss's autograd
Function, _ChunkedHeadLoss) count as "head + loss" and not as linears, and clip_grad_norm_'s foreach kernels
as the optimizer. Host gaps = wall time - summed kernel time: the time the GPU waits for the host.
"""

from __future__ import annotations

import re
import time

PROFILE_STEPS = 3  # profiled after the timed steps: enough to average, few enough for a quick trace
PARTS = ("linears", "attention", "norms/elementwise", "head + loss", "optimizer", "copies", "other")
HOST_GAPS = "host gaps"

# (part, pattern, also searched in the ancestors), first match wins
_RULES = [
    ("optimizer", r"Optimizer\.(step|zero_grad)|adam|foreach|clip_grad", True),
    ("head + loss", r"ChunkedHeadLoss|log_softmax|nll_loss|cross_entropy|logsumexp|kl_div", True),
    # triton_tem: inductor's template kernels; without max-autotune the drafter's only ones are flex attention's
    ("attention", r"flex_attention|scaled_dot_product|sdpa|flash|fmha|attention|triton_tem", True),
    ("copies", r"memcpy|memset|aten::copy_|aten::_to_copy|aten::to\b|aten::contiguous|aten::clone|"
               r"aten::cat\b|CatArrayBatchedCopy|copy_kernel|direct_copy", False),
    ("linears", r"gemm|matmul|nvjet|xmma|cutlass|cublas|aten::(mm|addmm|bmm|linear)\b", False),
    ("norms/elementwise", r"triton_|elementwise|norm|reduce|aten::(add|mul|sub|div|silu|neg|rsqrt|pow|mean|"
                          r"exp|sigmoid|where|fill|zero|sum|sin|cos|eq|clamp|sqrt|abs)(_|\b)", False),
]
_COMPILED = [(part, re.compile(pattern, re.IGNORECASE), deep) for part, pattern, deep in _RULES]


def part_of(name: str, ancestors=()) -> str:
    """The part a kernel or op belongs to, from its name and (for the first three parts) its ancestors' names."""
    for part, pattern, deep in _COMPILED:
        if pattern.search(name) or (deep and any(pattern.search(a) for a in ancestors)):
            return part
    return "other"


def time_table(items, wall_s: float) -> list[tuple[str, float, float]]:
    """[(part, seconds, share)] for PARTS then host gaps. Shares are of max(wall, summed kernel time), so they
    sum to 1 even where kernels overlap (several streams, CPU threads) and the gaps are then 0."""
    seconds = dict.fromkeys(PARTS, 0.0)
    for name, ancestors, s in items:
        seconds[part_of(name, ancestors)] += s
    busy = sum(seconds.values())
    total = max(wall_s, busy)
    if total <= 0:
        raise ValueError("time_table: nothing was timed (wall time and kernel time are both 0)")
    seconds[HOST_GAPS] = total - busy
    return [(part, s, s / total) for part, s in seconds.items()]


def _ancestors(event) -> tuple[str, ...]:
    names, parent = [], event
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return tuple(names)


def profiler_items(prof, device_type: str) -> list[tuple[str, tuple[str, ...], float]]:
    """The timed items of a finished torch.profiler.profile: GPU kernels on CUDA, CPU ops' self time otherwise."""
    events = prof.events()
    if device_type == "cuda":  # each CPU op's kernels (the profiler links them by correlation id)
        return [(k.name, _ancestors(e), k.duration / 1e6)
                for e in events if e.device_type.name == "CPU" and not e.is_async for k in e.kernels]
    return [(e.name, _ancestors(e.cpu_parent), e.self_cpu_time_total / 1e6)
            for e in events if e.device_type.name == "CPU" and not e.is_async]


def top_names(items, part: str, k: int = 5) -> list[tuple[str, float]]:
    """The k names with the most time in `part` (to check the grouping, e.g. what "other" holds)."""
    seconds = {}
    for name, ancestors, s in items:
        if part_of(name, ancestors) == part:
            seconds[name] = seconds.get(name, 0.0) + s
    return sorted(seconds.items(), key=lambda kv: -kv[1])[:k]


def format_table(rows, wall_s: float, num_steps: int, flop: dict | None = None) -> str:
    """The table as text: ms per step and share for each part; TFLOP/s where `flop` (per step) names the part."""
    flop = flop or {}
    lines = [f"time per part over {num_steps} profiled steps ({wall_s / num_steps * 1e3:.1f} ms per step, "
             f"profiler on):",
             f"  {'part':<18} {'ms/step':>9} {'share':>7} {'TFLOP/s':>9}"]
    for part, s, share in rows:
        rate = f"{flop[part] / (s / num_steps) / 1e12:9.4g}" if flop.get(part) and s > 0 else f"{'':>9}"
        lines.append(f"  {part:<18} {s / num_steps * 1e3:9.2f} {share:7.3f} {rate}")
    return "\n".join(lines)


def profile_steps(step, sync, device_type: str, part_flop: dict | None = None) -> dict:
    """step(i) for i < PROFILE_STEPS under torch.profiler (the caller has warmed up): prints the time per part,
    what "other" holds and the top kernels; returns the parts for the JSON."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    with profile(activities=activities) as prof:
        sync()
        t0 = time.perf_counter()
        for i in range(PROFILE_STEPS):
            step(i)
        sync()
        wall = time.perf_counter() - t0
    items = profiler_items(prof, device_type)
    rows = time_table(items, wall)
    print(format_table(rows, wall, PROFILE_STEPS, part_flop))
    print("  other: " + ", ".join(f"{name[:50]} {s / PROFILE_STEPS * 1e3:.2f} ms"
                                  for name, s in top_names(items, "other")))
    sort = "cuda_time_total" if device_type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=20, max_name_column_width=60))
    return {"steps": PROFILE_STEPS, "wall_s_per_step": wall / PROFILE_STEPS,
            "parts": {part: {"s_per_step": s / PROFILE_STEPS, "share": share} for part, s, share in rows}}
