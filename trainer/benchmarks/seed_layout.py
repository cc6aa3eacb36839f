"""The seed's layout on one host, measured (issue 14): T target ranks feed D drafter ranks under torchrun.

dflash-train itself runs every job (`python -m torch.distributed.run --standalone --nproc-per-node T+D -m
dflash_trainer.cli ...`, the command of dist_train.py's docstring, with dflash-train's own flags); this script owns
no loop, launcher, schedule or trainer default. It writes a random target of the seed's family (Qwen3.5/3.6:
make_tiny.qwen3_5_config, Gated DeltaNet + every 4th layer full attention) and random full-length data, measures the
matrix peak in this process (matmul_peak.py), reads the ranks' profile.jsonl rows (DFLASH_PROFILE_INTERVAL=0: a
row per transfer and per step) and kills a job once its last step is in (the final checkpoint is no figure).

    python -m benchmarks.seed_layout --preset cpu-8 --splits 5:3,4:4 --out /tmp/seed.json   # CPU, gloo
    python -m benchmarks.seed_layout --preset h200-x8-seed --out $OUT/seed-5-3.json         # 8 GPUs: 5+3
    python -m benchmarks.seed_layout --preset h200-x8-seed --splits 6:2,5:3,4:4,3:5 ...     # the sweep

Layout: GPU, --target-gpus/--drafter-gpus (preset: 0-4 and 5-7; --splits T:D gives GPUs 0..T-1 and T..T+D-1);
CPU (--device cpu), --target-ranks T of T+D processes.

Figures per job, after --warmup-steps drafter steps (compilation), from the ranks' cumulative counters:
  target stage   sum over target ranks of tokens / (data + forward seconds): what the targets give when never
                 held up (their `send` seconds, waiting for room in a drafter's queue, left out);
  drafter stage  sum over drafter ranks of tokens / (forward/backward + optimizer seconds) (queue waits left out);
  end to end     tokens the drafter ranks trained on in the window, at most what the target ranks made in it (a
                 queue filled during the warm-up is no part of it) / its wall time; goal >= 0.9 of the slower stage;
  TFLOP/s        stage rate x FLOP per token (target: pipeline.target_flop_per_token with only the full-attention
                 layers' attention term; the delta rule's state update, ~0.3 % at the 27B shape, is not counted;
                 drafter: pipeline.drafter_flop_per_micro_batch), against the peak x the stage's ranks;
  queue          each drafter rank's queue depth after each step over time; the share of the drafters' time spent
                 waiting for hidden states (starved) and of the targets' spent waiting to hand them over (stalled).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from dflash_trainer import cli  # (stdlib only)
from dflash_trainer.telemetry.writers import read_jsonl  # (stdlib only)

from . import pipeline  # write_data, run_job, FLOP formulas
from .matmul_peak import PEAK_N, describe, measure_peak
from .preset_args import parse_with_preset

TRAIN_FLAGS = ("target_gpus", "drafter_gpus", "device", "target_ranks", "target_gpus_per_rank", "token_budget",
               "max_seq_len", "max_batch_size", "grad_accum", "hs_queue_depth", "hs_queue_min_ready",
               "hs_sync_transfers", "block_size", "max_anchors", "num_draft_layers", "num_target_taps", "gamma",
               "use_soft_labels", "lr", "seed")
# Per preset: the target's shape (make_tiny.qwen3_5_config's arguments), the data's sequence length, the drafter
# steps of a job, and dflash-train flags given before the user's. The drafter's hidden size is the target's; its 5
# layers, block 32 and 1024 anchors are dflash-train's defaults (the seed's), so no preset names them.
PRESETS = {
    # make_tiny's hybrid target (8 layers, hidden 64, vocab 512); 5+3 gloo processes; < 3 min on 2 cores
    "cpu-8": dict(shape=dict(num_layers=8, hidden=64), seq_len=256, steps=8, warmup=2, timeout=150,
                  train=["--device", "cpu", "--target-gpus", "", "--drafter-gpus", "", "--target-ranks", "5",
                         "--block-size", "4", "--max-anchors", "16", "--num-draft-layers", "1", "--gamma", "4",
                         "--token-budget", "1024", "--max-seq-len", "256", "--max-batch-size", "4",
                         "--grad-accum", "1", "--hs-queue-depth", "4", "--hs-queue-min-ready", "2"]),
    # Qwen3.6-27B's text model, all 64 layers (48 Gated DeltaNet + 16 full attention): ~27 B parameters, 54 GB in
    # bf16 on each target GPU; the seed's settings: queue 90/30, 49,152 tokens, 8,192 long, <= 64 sequences, accum 4
    "h200-x8-seed": dict(shape=dict(num_layers=64, hidden=5120, vocab=248320, heads=24, kv_heads=4, head_dim=256,
                                    intermediate=17408, linear_key_heads=16, linear_value_heads=48,
                                    linear_head_dim=128, max_positions=262144, initializer_range=0.02),
                         seq_len=8192, steps=10, warmup=2, timeout=590,
                         train=["--target-gpus", "0,1,2,3,4", "--drafter-gpus", "5,6,7", "--token-budget", "49152",
                                "--max-seq-len", "8192", "--max-batch-size", "64", "--grad-accum", "4",
                                "--hs-queue-depth", "90", "--hs-queue-min-ready", "30"]),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), required=True)
    p.add_argument("--splits", default=None, help="T:D,... one job per split (e.g. 6:2,5:3,4:4,3:5), a table")
    p.add_argument("--steps", type=int, default=None, help="drafter optimizer steps per job (preset's)")
    p.add_argument("--warmup-steps", type=int, default=None, help="first steps left out of the figures")
    p.add_argument("--target-layers", type=int, default=None, help="layers of the random target (preset's)")
    p.add_argument("--timeout", type=float, default=None, help="seconds one job may take (preset's)")
    p.add_argument("--work-dir", default=None, help="target, data and run dirs (default: a temporary dir, removed)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--inputs-only", action="store_true",
                   help="write the target and data into --work-dir and stop (a later call with it runs the jobs)")
    cli.add_train_flags(p, only=TRAIN_FLAGS)
    return p


def parse_splits(text: str) -> list[tuple[int, int]]:
    try:
        splits = [tuple(int(n) for n in part.split(":")) for part in text.split(",")]
    except ValueError:
        splits = []
    if not splits or any(len(s) != 2 or min(s) < 1 for s in splits):
        raise ValueError(f"--splits {text!r}: give target:drafter rank counts, each at least 1, e.g. 5:3,4:4")
    return splits


def job_layouts(args, train: dict, cuda: bool) -> list[tuple[int, int, list[str]]]:
    """(T, D, dflash-train flags placing them) per job: --splits, else the given/preset layout."""
    if args.splits:
        out = []
        for t, d in parse_splits(args.splits):
            place = ([f"--target-gpus={','.join(map(str, range(t)))}",
                      f"--drafter-gpus={','.join(map(str, range(t, t + d)))}"] if cuda else
                     [f"--target-ranks={t}"])
            out.append((t, d, place))
        return out
    if cuda:
        t, d = len(train["target_gpus"]), len(train["drafter_gpus"])
        return [(t, d, [])]
    return [(train["target_ranks"], 8 - train["target_ranks"], [])]


def stage_rates(profile: list[dict], warmup: int) -> dict:
    """The figures of one job from its profile rows (see the module docstring)."""
    by_rank = {}
    for r in sorted(profile, key=lambda r: r["time"]):
        by_rank.setdefault(r["rank"], []).append(r)
    target, drafter, ranks = {}, {}, {}
    for rank, rows in by_rank.items():
        role = rows[0]["role"]
        last = rows[-1]
        ranks[str(rank)] = {"role": role, "tokens": last["tokens"], "items": last["items"]}
        if role == "target":
            moved = [r for r in rows if r["items"] > 0]
            a, b = (moved[0], moved[-1]) if len(moved) >= 2 else ({"tokens": 0, "seconds": {}}, last)
            busy = sum(b["seconds"].get(k, 0) - a["seconds"].get(k, 0) for k in ("data", "target"))
            sent = b["seconds"].get("send", 0) - a["seconds"].get("send", 0)
            target[rank] = (b["tokens"] - a["tokens"], busy, sent)
        else:
            steps = [r for r in rows if r.get("step_s") is not None]
            a = next((r for r in steps if r["step"] == warmup), None) if warmup else rows[0]
            b = steps[-1] if steps else last
            a = a or rows[0]
            busy = sum(b["seconds"].get(k, 0) - a["seconds"].get(k, 0) for k in ("drafter_fwd_bwd", "optimizer"))
            waited = b["seconds"].get("queue_wait", 0) - a["seconds"].get("queue_wait", 0)
            drafter[rank] = (b["tokens"] - a["tokens"], busy, waited, a["time"], b["time"])
    out = {"ranks": ranks}
    out["target_tokens_per_s"] = sum(t / s for t, s, _ in target.values() if s > 0) or None
    out["drafter_tokens_per_s"] = sum(t / s for t, s, *_ in drafter.values() if s > 0) or None
    t0, t1 = min(v[3] for v in drafter.values()), max(v[4] for v in drafter.values())
    out["window_s"] = t1 - t0
    # what the drafters trained on in the window, but never more than the targets made in it (the queue filled
    # during the warm-up is no part of the rate)
    consumed = sum(v[0] for v in drafter.values())
    produced = sum(pipeline.tokens_at([r for r in rows if r["items"] > 0], t1) -
                   pipeline.tokens_at([r for r in rows if r["items"] > 0], t0)
                   for rows in by_rank.values() if rows[0]["role"] == "target")
    out["end_to_end_tokens_per_s"] = min(consumed, produced) / (t1 - t0) if t1 > t0 else None
    out["drafter_wait_share"] = sum(v[2] for v in drafter.values()) / max(1e-9, sum(v[2] + v[1] for v in
                                                                                     drafter.values()))
    out["target_wait_share"] = sum(v[2] for v in target.values()) / max(1e-9, sum(v[2] + v[1] for v in
                                                                                   target.values()))
    t_start = min(r["time"] for r in profile)
    steps = {}
    for r in profile:
        if r["role"] == "drafter" and r.get("step_s") is not None:
            steps.setdefault(r["step"], {})[str(r["rank"])] = (r["time"], r.get("queue_depth"))
    out["queue_over_time"] = [{"step": s, "t": round(max(t for t, _ in v.values()) - t_start, 3),
                               "depth": {k: q for k, (_, q) in sorted(v.items())}} for s, v in sorted(steps.items())]
    return out


def run_split(t: int, d: int, place: list[str], base: list[str], spec: dict, work: str, env: dict) -> dict:
    name = f"{t}-{d}"
    run_dir = os.path.join(work, f"run-{name}")
    shutil.rmtree(run_dir, ignore_errors=True)  # a job of an earlier call would resume from its checkpoint
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(t + d),
           "-m", "dflash_trainer.cli", *base, *place, "--output-dir", run_dir]
    print(f"job {t}:{d}: " + " ".join(cmd[1:8]) + " ...", flush=True)

    def done(path):  # every drafter rank has logged its last step
        rows = read_jsonl(os.path.join(path, "profile.jsonl"))
        return len({r["rank"] for r in rows if r["role"] == "drafter" and r.get("step") == spec["steps"]
                    and r.get("step_s") is not None}) == d
    wall = pipeline.run_job(cmd, run_dir, os.path.join(work, f"{name}.log"), done, spec["timeout"], env)
    rates = stage_rates(read_jsonl(os.path.join(run_dir, "profile.jsonl")), spec["warmup"])
    # which linear-attention code ran: transformers logs each kernel it replaces by its torch reference code
    with open(os.path.join(work, f"{name}.log"), errors="replace") as f:
        fallbacks = sorted({line.strip() for line in f if "falling back" in line.lower()})
    return {"split": f"{t}:{d}", "target_ranks": t, "drafter_ranks": d, "job_wall_s": round(wall, 1),
            "command": cmd, "kernel_fallbacks": fallbacks, **rates}


def main(argv=None) -> int:
    args, preset = parse_with_preset(build_parser, lambda name: PRESETS[name]["train"], argv)
    spec = dict(PRESETS[preset], shape=dict(PRESETS[preset]["shape"]), preset=preset)
    for key, value in (("steps", args.steps), ("warmup", args.warmup_steps), ("timeout", args.timeout)):
        spec[key] = value if value is not None else spec[key]
    if args.target_layers:
        spec["shape"]["num_layers"] = args.target_layers
    train = cli.train_settings(args, TRAIN_FLAGS)
    import torch
    cuda = train["device"] != "cpu"
    if cuda and not torch.cuda.is_available():
        print(f"seed_layout.py: error: --preset {preset} needs CUDA GPUs; on the CPU use --preset cpu-8",
              file=sys.stderr)
        return 2
    try:
        layouts = job_layouts(args, train, cuda)
    except ValueError as e:
        print(f"seed_layout.py: error: {e}", file=sys.stderr)
        return 2
    # GPUs a job needs: its split's, or the distinct indexes of the given layout (a target and a drafter rank may
    # share one GPU: the advisor's one-GPU check, issue 31)
    need = max(t + d for t, d, _ in layouts) if args.splits else len(set(train["target_gpus"] + train["drafter_gpus"]))
    if cuda and need > torch.cuda.device_count():
        print(f"seed_layout.py: error: a split needs {need} GPUs, "
              f"{torch.cuda.device_count()} are visible; give --splits that fit", file=sys.stderr)
        return 2
    if args.inputs_only and not args.work_dir:
        print("seed_layout.py: error: --inputs-only keeps what it writes only in a --work-dir; give one",
              file=sys.stderr)
        return 2
    work = args.work_dir or tempfile.mkdtemp(prefix="dflash-seed-layout-")
    os.makedirs(work, exist_ok=True)
    result = {"preset": preset, "train_flags": train, "steps": spec["steps"], "warmup_steps": spec["warmup"],
              "jobs": []}
    env = dict(os.environ, DFLASH_PROFILE_INTERVAL="0", PYTHONUNBUFFERED="1")
    if not cuda:
        env.setdefault("OMP_NUM_THREADS", "1")
    try:
        device = torch.device("cuda:0" if cuda else "cpu")
        result["peak"] = measure_peak(device, PEAK_N[device.type])
        print("peak: " + describe(result["peak"]), flush=True)
        result.update(write_inputs(torch, spec, train, device, work))
        if args.inputs_only:
            save(args.out, result)
            return 0
        base = ["--target-model", os.path.join(work, "target"), "--data-dir", os.path.join(work, "data"),
                "--max-steps", str(spec["steps"]), "--epochs", "1000", "--log-interval", "1",
                "--checkpoint-interval", "1000000", "--heartbeat-interval", "1", *cli.given_train_argv(args)]
        for t, d, place in layouts:
            result["jobs"].append(run_split(t, d, place, base, spec, work, env))
            save(args.out, result)
    except Exception as e:  # noqa: BLE001 - what was measured is still written
        result["error"] = f"{type(e).__name__}: {e}"
        save(args.out, result)
        print(f"seed_layout.py: error: {result['error']}", file=sys.stderr)
        return 1
    finally:
        if args.work_dir is None and "error" not in result:
            shutil.rmtree(work, ignore_errors=True)
    report(result)
    save(args.out, result)
    return 0


def write_inputs(torch, spec: dict, train: dict, device, work: str) -> dict:
    """The random hybrid target and its data; the FLOP per token of each stage. A --work-dir that holds them for
    the same shape, data and drafter flags is reused (the 27B target takes minutes to write: one lease call
    writes it, the next ones time other splits)."""
    from dflash_trainer.config import default_target_layer_ids
    from dflash_trainer.model.drafter import DrafterConfig
    from dflash_trainer.prep.make_tiny import qwen3_5_config, write_target
    per_batch = max(1, min(train["token_budget"] // spec["seq_len"], train["max_batch_size"]))
    # a preset's job on up to 8 drafter ranks in one epoch (--epochs is high: more steps repeat the data), and the
    # same data whatever --steps, so a --work-dir's target is reused by calls with other --steps
    micro_batches = PRESETS[spec["preset"]]["steps"] * train["grad_accum"] * 8
    key = {"shape": spec["shape"], "seq_len": spec["seq_len"], "sequences": micro_batches * per_batch,
           "drafter": {k: train[k] for k in ("num_draft_layers", "num_target_taps", "block_size", "max_anchors",
                                             "token_budget", "max_batch_size")}}
    made = os.path.join(work, "inputs.json")
    if os.path.exists(made):
        with open(made) as f:
            saved = json.load(f)
        if saved["key"] == key:
            print(f"target and data: reused from {work}", flush=True)
            return saved["inputs"]
    t0 = time.time()
    config = qwen3_5_config(**spec["shape"])
    model = write_target(os.path.join(work, "target"), seed=0, config=config, device=str(device))
    text = config.text_config
    layer_params = sum(p.numel() for p in model.model.language_model.layers.parameters())
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    pipeline.write_data(os.path.join(work, "data"), micro_batches * per_batch, spec["seq_len"], text.vocab_size)
    full = text.layer_types.count("full_attention")
    print(f"target: Qwen3_5ForConditionalGeneration (text: Qwen3_5TextConfig), {text.num_hidden_layers} layers = "
          f"{text.num_hidden_layers - full} linear attention (Gated DeltaNet) + {full} full attention, hidden "
          f"{text.hidden_size}, vocab {text.vocab_size}, {layer_params / 1e9:.3g} B parameters in its layers; "
          f"written in {time.time() - t0:.0f} s; data: {micro_batches * per_batch} random sequences of "
          f"{spec['seq_len']} tokens", flush=True)
    shape = {"layers": full, "heads": text.num_attention_heads, "head_dim": text.head_dim}
    layer_ids = default_target_layer_ids(text.num_hidden_layers, train["num_target_taps"])
    drafter_cfg = DrafterConfig.from_target(config, train["num_draft_layers"], layer_ids, train["block_size"],
                                            text.vocab_size - 1)
    drafter_flop, tokens = pipeline.drafter_flop_per_micro_batch(torch, drafter_cfg, os.path.join(work, "data"),
                                                                 train)
    inputs = {"target": {"layers": text.layer_types, "layer_params": layer_params, "taps": layer_ids},
              "flop_per_token": {"target": pipeline.target_flop_per_token(shape, layer_params, spec["seq_len"]),
                                 "drafter": drafter_flop / tokens}}
    with open(made, "w") as f:
        json.dump({"key": key, "inputs": inputs}, f)
    return inputs


def save(path, result):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=2)


def report(result: dict) -> None:
    peak, flop = result["peak"]["tflops"], result["flop_per_token"]
    for job in result["jobs"]:
        t, d = job["target_ranks"], job["drafter_ranks"]
        print(f"--- {job['split']} ({t} target + {d} drafter ranks), steps {result['warmup_steps']}.."
              f"{result['steps']} over {job['window_s']:.1f} s; peak {peak:.4g} TFLOP/s per device")
        stages = [("target stage", job["target_tokens_per_s"], flop["target"], t),
                  ("drafter stage", job["drafter_tokens_per_s"], flop["drafter"], d),
                  ("end to end", job["end_to_end_tokens_per_s"], flop["target"] + flop["drafter"], t + d)]
        for name, rate, per_token, devices in stages:
            tflops = rate * per_token / 1e12 if rate else None
            job.setdefault("tflops", {})[name] = tflops
            print(f"{name:<15} {rate or 0:12.1f} tokens/s  {tflops or 0:9.3f} TFLOP/s  "
                  f"{(tflops or 0) / (peak * devices):6.3f} of the peak x {devices}")
        slower = min(job["target_tokens_per_s"] or 0, job["drafter_tokens_per_s"] or 0)
        job["slower_stage"] = "drafter" if slower == job["drafter_tokens_per_s"] else "target"
        job["end_to_end_over_slower"] = job["end_to_end_tokens_per_s"] / slower if slower else None
        print(f"end to end / slower stage ({job['slower_stage']}): {job['end_to_end_over_slower'] or 0:.3f} "
              f"(goal >= 0.9); drafters waited for hidden states {job['drafter_wait_share']:.0%} of their time, "
              f"targets waited to hand over {job['target_wait_share']:.0%}")
        print("linear attention: " + ("; ".join(job["kernel_fallbacks"]) or "no fallback logged (fast kernels)"))
        q = job["queue_over_time"]
        shown = q if len(q) <= 12 else [q[round(i * (len(q) - 1) / 11)] for i in range(12)]
        print("queue depth per drafter rank after each step: " + "; ".join(
            f"t={r['t']:.1f}s step {r['step']} {list(r['depth'].values())}" for r in shown))
    if len(result["jobs"]) > 1:
        print(f"{'split':<6} {'target tok/s':>13} {'drafter tok/s':>14} {'e2e tok/s':>11} {'e2e/slower':>10} "
              f"{'slower':>8} {'drafter wait':>12} {'target wait':>11}")
        for job in result["jobs"]:
            print(f"{job['split']:<6} {job['target_tokens_per_s'] or 0:13.1f} {job['drafter_tokens_per_s'] or 0:14.1f}"
                  f" {job['end_to_end_tokens_per_s'] or 0:11.1f} {job['end_to_end_over_slower'] or 0:10.3f} "
                  f"{job['slower_stage']:>8} {job['drafter_wait_share']:12.0%} {job['target_wait_share']:11.0%}")
        best = max(result["jobs"], key=lambda j: j["end_to_end_tokens_per_s"] or 0)
        result["best_split"] = best["split"]
        print(f"best split: {best['split']} ({best['end_to_end_tokens_per_s']:.1f} tokens/s end to end)")


if __name__ == "__main__":
    sys.exit(main())
