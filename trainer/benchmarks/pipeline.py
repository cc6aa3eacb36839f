"""The target -> drafter pipeline of dflash-train under torchrun, timed against the hardware peak (issue 13).

Random weights: a Qwen3-shaped target written to disk, random token data, and dflash-train itself driving
them. This script owns no training loop, launcher, schedule or default of the trainer: it starts
`python -m torch.distributed.run --standalone --nproc-per-node 2 -m dflash_trainer.cli ...` (1 target rank +
1 drafter rank) and, where the two stages share a device, plain `python -m dflash_trainer.cli ...` (the two
stages back to back in one process); it reads their metrics.jsonl and profile.jsonl (DFLASH_PROFILE_INTERVAL=0:
a row per transfer and per step) and kills a job once its last step is measured (the final checkpoint, 22 GB at
the 27B shape, is no part of the figures).

    python -m benchmarks.pipeline --preset cpu-tiny --out /tmp/pipeline.json      # CPU, gloo, < 1 min
    python -m benchmarks.pipeline --preset h200-27b --out $OUT/pipeline.json      # GPUs

Modes (--mode auto picks by what is there): nccl = two GPUs, target on cuda:0 and drafter on cuda:1, hidden states
over NCCL point-to-point; shared = both ranks on cuda:0, host-staged over gloo (NCCL refuses two ranks on one
device), plus the one-process run on that GPU; cpu = gloo on the CPU, plus the one-process run.

One job, three phases, read off the ranks' rows (--hs-queue-depth = --hs-queue-min-ready = --fill micro-batches):
  1. target alone: the drafter waits until --fill micro-batches are in its queue; the target's rate over
     transfers 1..fill (from the completion of the first, so its warm-up is left out);
  2. pipeline: the drafter trains while the target refills the queue; after --warmup-steps steps (torch.compile
     of the drafter takes minutes the first time), end-to-end tokens/s over the steps that end before the
     target's last transfer (the smaller of the drafter's and the target's tokens over that window);
  3. drafter alone: the target is done; the steps that start after its last transfer drain the queue.
A target-bound pipeline empties the queue before the target is done: then phase 3 has no step and the drafter's
own step time is its busy time (step time less queue wait) in phase 2, and the output says so.

FLOPs: the drafter's from train_step.flop_estimate (forward + backward + frozen head, per micro-batch); the target's
2 x parameters per token + causal attention (4 x T(T+1)/2 x heads x head_dim per layer and sequence).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from dflash_trainer import cli  # (stdlib only; torch is imported in main)
from dflash_trainer.prep import make_tiny  # (stdlib only at import, like cli)
from dflash_trainer.telemetry.writers import read_jsonl  # (stdlib only)

from .matmul_peak import measure_peak  # (imports torch only when called)
from .preset_args import parse_with_preset

# dflash-train's flags this benchmark hands on (declared, defaulted and checked in config/train_config.py only).
TRAIN_FLAGS = ("block_size", "max_anchors", "num_draft_layers", "num_target_taps", "gamma", "token_budget",
               "max_seq_len", "max_batch_size", "grad_accum", "hs_queue_depth", "hs_queue_min_ready",
               "hs_sync_transfers", "use_soft_labels", "head_chunk_size", "seed", "lr")
# Per preset: the random target's shape, the phases (micro-batches), the matmul size of the peak, and dflash-train
# flags given before the user's (which win). A flag neither sets has dflash-train's default (block 32, 1024
# anchors, 5 draft layers, 5 taps: the seed's drafter).
PRESETS = {
    # Qwen3.5-27B-like (hidden 5120, 24 heads of 256, 4 KV heads, MLP 17408, vocab 248,320; tied embeddings) with
    # 32 of its 64 layers: what fits one H200 beside the drafter (its step peaks at ~98 GB, results/
    # train-step-h200-27b-compiled.json; 32 layers are 21.8 GB + 2.5 GB of embedding, + ~6 GB of hidden states).
    "h200-27b": dict(shape=dict(hidden=5120, layers=32, heads=24, kv_heads=4, head_dim=256, intermediate=17408,
                                vocab=248320, seq_len=8192),
                     fill=8, warmup=3, measure=8, matmul=8192, timeout=420,
                     train=["--token-budget", "8192", "--max-seq-len", "8192", "--max-batch-size", "1",
                            "--grad-accum", "1"]),
    # The dflash-make-tiny target's shape (8 layers, hidden 64, vocab 512), README demo drafter flags.
    "cpu-tiny": dict(shape=dict(hidden=64, layers=8, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512,
                                seq_len=256),
                     fill=6, warmup=2, measure=8, matmul=1024, timeout=120,
                     train=["--block-size", "8", "--max-anchors", "64", "--num-draft-layers", "2", "--gamma", "4",
                            "--token-budget", "1024", "--max-seq-len", "256", "--grad-accum", "1"]),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), required=True)
    p.add_argument("--mode", choices=("auto", "nccl", "shared", "cpu"), default="auto",
                   help="auto: nccl with 2+ GPUs, shared with one, cpu without CUDA (cpu-tiny: always cpu)")
    p.add_argument("--target-layers", type=int, default=None, help="layers of the random target (preset's)")
    p.add_argument("--fill", type=int, default=None, help="micro-batches queued before the drafter starts")
    p.add_argument("--warmup-steps", type=int, default=None, help="drafter steps left out (compilation)")
    p.add_argument("--measure", type=int, default=None, help="micro-batches of the pipeline phase after warm-up")
    p.add_argument("--timeout", type=float, default=None, help="seconds one job may take")
    p.add_argument("--work-dir", default=None, help="target, data and run dirs (default: a temporary dir, removed)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    cli.add_train_flags(p, only=TRAIN_FLAGS)
    return p


def parse_args(argv):
    args, preset = parse_with_preset(build_parser, lambda name: PRESETS[name]["train"], argv)
    spec = dict(PRESETS[preset])
    for key, attr in (("fill", "fill"), ("warmup", "warmup_steps"), ("measure", "measure"), ("timeout", "timeout")):
        if getattr(args, attr) is not None:
            spec[key] = getattr(args, attr)
    spec["shape"] = dict(spec["shape"])
    if args.target_layers is not None:
        spec["shape"]["layers"] = args.target_layers
    return args, spec


# --- measurements in this process ---

def write_target(torch, path: str, shape: dict, device) -> dict:
    """A random Qwen3 target (tied embeddings), made on `device`, saved with save_pretrained."""
    from transformers import Qwen3Config
    config = Qwen3Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                         num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                         head_dim=shape["head_dim"], intermediate_size=shape["intermediate"],
                         max_position_embeddings=max(shape["seq_len"] * 2, 4096), tie_word_embeddings=True)
    model = make_tiny.write_target(path, seed=0, config=config, device=str(device))
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"params": params, "layer_params": params - embed - shape["hidden"], "config": config}


def write_data(path: str, num_sequences: int, seq_len: int, vocab: int) -> None:
    """Random ids of full length; loss on every token but the first 16 (all sequences as long as
    --max-seq-len, so each micro-batch holds the same tokens)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab - 2, size=(num_sequences, seq_len), dtype=np.int32)
    mask = np.ones((num_sequences, seq_len), dtype=np.int8)
    mask[:, :16] = 0
    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))])
    table = pa.table({"input_ids": list(ids), "loss_mask": list(mask)}, schema=schema)
    pq.write_table(table, os.path.join(path, "shard-00000.parquet"))


# --- running dflash-train ---

def run_job(cmd: list[str], run_dir: str, log_path: str, done, timeout: float, env: dict) -> float:
    """Starts dflash-train, waits until done(run_dir) (its last measured row is in), then kills it if it still runs
    (torchrun's ranks die with their agent). Returns the wall time. A job that exits first fails the benchmark."""
    t0 = time.time()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        while not done(run_dir):
            if proc.poll() is not None:
                if done(run_dir):
                    break
                tail = open(log_path, errors="replace").read()[-4000:]
                raise RuntimeError(f"dflash-train exited with {proc.returncode} before its last step:\n{tail}")
            if time.time() - t0 > timeout:
                raise RuntimeError(f"dflash-train took over {timeout:.0f} s (--timeout); log: {log_path}")
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        wait_ranks_gone(run_dir)
    return time.time() - t0


def wait_ranks_gone(run_dir: str, timeout: float = 30.0) -> None:
    pids = []
    for name in os.listdir(os.path.join(run_dir, "ranks")) if os.path.isdir(os.path.join(run_dir, "ranks")) else []:
        try:
            pids.append(int(open(os.path.join(run_dir, "ranks", name)).read()))
        except (OSError, ValueError):
            pass
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(os.path.exists(f"/proc/{p}") and "\tZ" not in _state(p) for p in pids):
            return
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line for line in f if line.startswith("State:")), "")
    except OSError:
        return ""


# --- reading the phases ---

def rate(rows: list[dict], i: int, j: int, key: str = "tokens") -> float | None:
    dt = rows[j]["time"] - rows[i]["time"]
    return (rows[j][key] - rows[i][key]) / dt if j > i and dt > 0 else None


def tokens_at(rows: list[dict], t: float) -> float:
    """Cumulative tokens of a rank at time t (rows sorted by time; linear between rows)."""
    prev = {"time": -math.inf, "tokens": 0}
    for r in rows:
        if r["time"] >= t:
            if prev["time"] == -math.inf:
                return 0.0
            return prev["tokens"] + (r["tokens"] - prev["tokens"]) * (t - prev["time"]) / (r["time"] - prev["time"])
        prev = r
    return prev["tokens"]


def phases(profile: list[dict], fill: int, warmup: int) -> dict:
    target = sorted((r for r in profile if r["role"] == "target" and not r.get("done")), key=lambda r: r["time"])
    done = [r for r in profile if r["role"] == "target" and r.get("done")]
    drafter = sorted((r for r in profile if r["role"] == "drafter" and r.get("step_s") is not None
                      and not r.get("done")), key=lambda r: r["time"])
    t_done = done[0]["time"] if done else target[-1]["time"]
    out = {"target_items": len(target), "drafter_steps": len(drafter), "target_done_at_step": None}
    # 1. target alone: transfers 1..fill (the drafter starts once `fill` are in)
    alone = [r for r in target if r["items"] <= fill]
    out["target_tokens_per_s"] = rate(alone, 0, len(alone) - 1) if len(alone) >= 3 else None
    out["target_window"] = [alone[0]["items"], alone[-1]["items"]] if alone else None
    # 2. pipeline: steps after the warm-up that end while the target still sends
    steady = drafter[warmup:]
    piped = [r for r in steady if r["time"] <= t_done]
    out["pipeline_steps"] = len(piped)
    if len(piped) >= 2:
        # from the end of the last warm-up step (or the first steady one) to the last step inside the window
        start = drafter[warmup - 1] if warmup >= 1 else piped[0]
        t0, t1 = start["time"], piped[-1]["time"]
        consumed = piped[-1]["tokens"] - start["tokens"]
        produced = tokens_at(target, t1) - tokens_at(target, t0)
        out["drafter_window_tokens_per_s"] = consumed / (t1 - t0)
        out["target_window_tokens_per_s"] = produced / (t1 - t0)
        out["end_to_end_tokens_per_s"] = min(consumed, produced) / (t1 - t0)
        out["queue_depth_window"] = [start.get("queue_depth"), piped[-1].get("queue_depth")]
        out["pipeline_window_s"] = t1 - t0
    else:
        out["end_to_end_tokens_per_s"] = None
    # 3. drafter alone: steps that start after the target's last transfer
    after = [r for r in steady if r["time"] - r["step_s"] >= t_done]
    out["drafter_alone_steps"] = len(after)
    if len(after) >= 2:
        out["drafter_step_s"] = sorted(r["step_s"] for r in after)[len(after) // 2]
        out["drafter_tokens_per_s"] = (after[-1]["tokens"] - after[0]["tokens"]) / sum(r["step_s"] for r in after[1:])
        out["drafter_alone_how"] = "steps after the target's last transfer (queue drain)"
    elif len(steady) >= 2:  # target-bound: the drafter's busy time between waits
        busy = [(b["step_s"] - (b["seconds"].get("queue_wait", 0) - a["seconds"].get("queue_wait", 0)),
                 b["tokens"] - a["tokens"]) for a, b in zip(steady, steady[1:])]
        busy.sort()
        out["drafter_step_s"] = busy[len(busy) // 2][0]
        out["drafter_tokens_per_s"] = sum(t for _, t in busy) / sum(s for s, _ in busy)
        out["drafter_alone_how"] = ("busy time (step less queue wait) in the pipeline phase: the queue emptied "
                                    "before the target was done (target-bound)")
    else:
        out["drafter_step_s"] = out["drafter_tokens_per_s"] = None
    out["cuda_max_allocated_gb"] = {str(r["rank"]): round(r.get("cuda_max_allocated_mb", 0) / 1024, 1)
                                    for r in profile if r.get("done") and "cuda_max_allocated_mb" in r}
    return out


def serial_rate(metrics: list[dict], warmup: int, seq_tokens: int) -> dict:
    """One process: the rate over the steps after the warm-up (each row = one step; sequences are all full)."""
    rows = sorted(metrics, key=lambda r: r["step"])
    if len(rows) < warmup + 2:
        return {"end_to_end_tokens_per_s": None}
    a, b = rows[warmup - 1] if warmup else rows[0], rows[-1]
    tokens = (b["sequences"] - a["sequences"]) * seq_tokens
    return {"end_to_end_tokens_per_s": tokens / (b["time"] - a["time"]), "steps": b["step"] - a["step"],
            "window_s": b["time"] - a["time"]}


# --- FLOPs ---

def target_flop_per_token(shape: dict, layer_params: int, seq_len: int) -> float:
    attn = shape["layers"] * 4 * (seq_len + 1) / 2 * shape["heads"] * shape["head_dim"]
    return 2 * layer_params + attn


def drafter_flop_per_micro_batch(torch, drafter_cfg, data_dir: str, train: dict) -> tuple[float, int]:
    """train_step.flop_estimate over one micro-batch of this data (its anchors drawn as the trainer draws them)."""
    from .train_step import flop_estimate

    from dflash_trainer.model.blocks import sample_anchors
    from dflash_trainer.data.batches import TokenizedDataset, collate
    dataset = TokenizedDataset(data_dir, train["max_seq_len"])
    per_batch = max(1, min(train["token_budget"] // train["max_seq_len"], train["max_batch_size"]))
    batch = collate(dataset, list(range(per_batch)))
    anchors, valid = sample_anchors(batch.loss_mask, train["max_anchors"], torch.Generator().manual_seed(0))
    T, S = batch.input_ids.shape[1], drafter_cfg.block_size
    k = torch.arange(1, S)
    pos = anchors[:, :, None] + k                                         # [B, A, S-1] label positions
    inside = pos < batch.lengths[:, None, None]
    labelled = torch.gather(batch.loss_mask, 1, pos.clamp(max=T - 1).flatten(1)).view_as(pos) & inside
    rows = int((labelled & valid[:, :, None]).sum())
    flops = flop_estimate(drafter_cfg, T, anchors, valid, rows)
    return float(flops["total"]), int(batch.lengths.sum())


# --- main ---

def main(argv=None) -> int:
    args, spec = parse_args(argv)
    import torch
    shape, fill, warmup, measure = spec["shape"], spec["fill"], spec["warmup"], spec["measure"]
    mode = args.mode
    if mode == "auto":
        mode = "cpu" if args.preset == "cpu-tiny" or not torch.cuda.is_available() else \
            "nccl" if torch.cuda.device_count() >= 2 else "shared"
    if (mode != "cpu" or args.preset != "cpu-tiny") and not torch.cuda.is_available():
        print(f"pipeline.py: error: --preset {args.preset} --mode {mode} needs CUDA; use --preset cpu-tiny",
              file=sys.stderr)
        return 2
    if mode == "cpu" and args.preset != "cpu-tiny":
        print(f"pipeline.py: error: --mode cpu takes --preset cpu-tiny, not {args.preset}", file=sys.stderr)
        return 2
    if mode == "nccl" and torch.cuda.device_count() < 2:
        print("pipeline.py: error: --mode nccl needs 2 GPUs; use --mode shared", file=sys.stderr)
        return 2
    train = cli.train_settings(args, TRAIN_FLAGS)
    if train["grad_accum"] != 1:
        print("pipeline.py: error: the phases count micro-batches as steps; keep --grad-accum 1", file=sys.stderr)
        return 2
    device = torch.device("cuda:0" if mode != "cpu" else "cpu")
    work = args.work_dir or tempfile.mkdtemp(prefix="dflash-pipeline-")
    os.makedirs(work, exist_ok=True)
    result = {"preset": args.preset, "mode": mode, "shape": shape, "train_flags": train,
              "phases": {"fill": fill, "warmup_steps": warmup, "measure": measure}}
    env = dict(os.environ, DFLASH_PROFILE_INTERVAL="0", PYTHONUNBUFFERED="1")
    if mode == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)

    try:
        # the peak first, in this process, on the GPU the target uses (then its memory is given back)
        peak = measure_peak(device, spec["matmul"])
        result["peak"] = peak
        print(f"peak: {peak['tflops']:.4g} TFLOP/s, best of ten {peak['n']}^3 {peak['dtype']} matrix products on "
              f"{peak['device']}" + (" (CPU: a smaller size, fp32 as the CPU path trains)" if mode == "cpu" else ""),
              flush=True)
        t0 = time.time()
        target_dir, data_dir = os.path.join(work, "target"), os.path.join(work, "data")
        made = write_target(torch, target_dir, shape, device)
        items = fill + warmup + measure
        per_batch = max(1, min(train["token_budget"] // shape["seq_len"], train["max_batch_size"]))
        write_data(data_dir, items * per_batch, shape["seq_len"], shape["vocab"])
        result["target"] = {"layers": shape["layers"], "params": made["params"], "layer_params": made["layer_params"]}
        print(f"target: {shape['layers']} layers, hidden {shape['hidden']}, vocab {shape['vocab']}, "
              f"{made['params'] / 1e9:.3g} B parameters (tied embeddings), random, written in "
              f"{time.time() - t0:.0f} s; data: {items * per_batch} random sequences of {shape['seq_len']} tokens, "
              f"{per_batch} per micro-batch", flush=True)

        from dflash_trainer.config import default_target_layer_ids
        from dflash_trainer.model.drafter import DrafterConfig
        layer_ids = default_target_layer_ids(shape["layers"], train["num_target_taps"])
        drafter_cfg = DrafterConfig.from_target(made["config"], train["num_draft_layers"], layer_ids,
                                                train["block_size"], shape["vocab"] - 1)
        drafter_flop, micro_tokens = drafter_flop_per_micro_batch(torch, drafter_cfg, data_dir, train)
        target_flop = target_flop_per_token(shape, made["layer_params"], shape["seq_len"]) * micro_tokens
        result["flop_per_micro_batch"] = {"target": target_flop, "drafter": drafter_flop, "tokens": micro_tokens}

        gpus = {"nccl": ("0", "1"), "shared": ("0", "0"), "cpu": ("", "")}[mode]
        base = ["--target-model", target_dir, "--data-dir", data_dir, "--mask-token-id", str(shape["vocab"] - 1),
                "--target-gpus", gpus[0], "--drafter-gpus", gpus[1], "--epochs", "1", "--log-interval", "1",
                "--checkpoint-interval", "1000000", "--heartbeat-interval", "1"]
        base += ["--device", "cpu"] if mode == "cpu" else []
        given = cli.given_train_argv(args, skip=("hs_queue_depth", "hs_queue_min_ready"))
        queue = [f"--hs-queue-depth={train['hs_queue_depth'] if 'hs_queue_depth' in vars(args) else fill}",
                 f"--hs-queue-min-ready={train['hs_queue_min_ready'] if 'hs_queue_min_ready' in vars(args) else fill}"]

        # the job: 1 target rank + 1 drafter rank
        run_dir = os.path.join(work, "pipeline")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "dflash_trainer.cli", *base, "--output-dir", run_dir, "--max-steps", str(items), *given, *queue]
        result["command"] = cmd
        print("job: " + " ".join(cmd[:7]) + " ... (1 target + 1 drafter rank, "
              f"{'NCCL' if mode == 'nccl' else 'gloo, host-staged'})", flush=True)

        def dist_done(d):
            prof = read_jsonl(os.path.join(d, "profile.jsonl"))
            return any(r.get("role") == "target" and r.get("done") for r in prof) and \
                any(r.get("role") == "drafter" and r.get("step") == items for r in prof)

        wall = run_job(cmd, run_dir, os.path.join(work, "pipeline.log"), dist_done, spec["timeout"], env)
        ph = phases(read_jsonl(os.path.join(run_dir, "profile.jsonl")), fill, warmup)
        ph["job_wall_s"] = wall
        result["pipeline"] = ph
        save()

        if mode != "nccl":  # the same two stages back to back in one process, on the same device
            serial_dir = os.path.join(work, "serial")
            steps = warmup + measure
            cmd1 = [sys.executable, "-m", "dflash_trainer.cli", *base, "--output-dir", serial_dir,
                    "--max-steps", str(steps), *given]
            wall = run_job(cmd1, serial_dir, os.path.join(work, "serial.log"),
                           lambda d: any(r.get("step") == steps for r in read_jsonl(os.path.join(d, "metrics.jsonl"))),
                           spec["timeout"], env)
            result["serial"] = serial_rate(read_jsonl(os.path.join(serial_dir, "metrics.jsonl")), warmup,
                                           shape["seq_len"])
            result["serial"]["job_wall_s"] = wall
    except Exception as e:  # noqa: BLE001 - what was measured is still written
        result["error"] = f"{type(e).__name__}: {e}"
        save()
        print(f"pipeline.py: error: {result['error']}", file=sys.stderr)
        return 1
    finally:
        if args.work_dir is None and "error" not in result:
            shutil.rmtree(work, ignore_errors=True)

    report(result, mode)
    save()
    return 0


def report(result: dict, mode: str) -> None:
    peak = result["peak"]["tflops"]
    f = result["flop_per_micro_batch"]
    per_token_target, per_token_drafter = f["target"] / f["tokens"], f["drafter"] / f["tokens"]
    ph = result["pipeline"]
    gpus = 2 if mode == "nccl" else 1
    figures = {}

    def line(name, tokens_per_s, flop_per_token, devices=1, note=""):
        if tokens_per_s is None:
            print(f"{name:<34} not measured {note}")
            figures[name] = None
            return
        tflops = tokens_per_s * flop_per_token / 1e12
        ratio = tflops / (peak * devices)
        figures[name] = {"tokens_per_s": tokens_per_s, "tflops": tflops, "ratio_to_peak": ratio}
        print(f"{name:<34} {tokens_per_s:12.1f} tokens/s  {tflops:9.3f} TFLOP/s  {ratio:6.3f} of peak"
              + (f" x {devices}" if devices > 1 else "") + (f"  {note}" if note else ""))

    print(f"--- {result['preset']}, mode {mode}; peak {peak:.4g} TFLOP/s ({result['peak']['dtype']}, "
          f"{result['peak']['n']}^3, {result['peak']['device']})")
    line("target forward alone", ph["target_tokens_per_s"], per_token_target,
         note=f"(transfers {ph['target_window']})")
    line("drafter step alone", ph["drafter_tokens_per_s"], per_token_drafter)
    if ph.get("drafter_step_s") is not None:
        print(f"{'':<34} {ph['drafter_step_s'] * 1e3:12.1f} ms per micro-batch of {f['tokens']} tokens "
              f"({ph['drafter_alone_how']})")
    line("end-to-end (pipeline)", ph["end_to_end_tokens_per_s"], per_token_target + per_token_drafter, gpus,
         note=f"(over {ph.get('pipeline_steps')} steps, {ph.get('pipeline_window_s', 0):.1f} s; queue "
              f"{ph.get('queue_depth_window')})")
    stages = [x for x in (ph["target_tokens_per_s"], ph["drafter_tokens_per_s"]) if x]
    e2e = ph["end_to_end_tokens_per_s"]
    summary = {"figures": figures}
    if e2e and len(stages) == 2:
        slower = min(stages)
        summary["end_to_end_over_slower_stage"] = e2e / slower
        print(f"end-to-end / slower stage alone     {e2e / slower:.3f}   (goal >= 0.9; slower: "
              f"{'drafter' if slower == ph['drafter_tokens_per_s'] else 'target'})")
    if "serial" in result:
        s = result["serial"]["end_to_end_tokens_per_s"]
        line("both stages in one process", s, per_token_target + per_token_drafter)
        if s and e2e:
            summary["end_to_end_over_one_process"] = e2e / s
            print(f"end-to-end / one process            {e2e / s:.3f}   (goal >= 0.9 for two processes on one "
                  f"{'GPU' if mode == 'shared' else 'CPU'})")
    if ph.get("cuda_max_allocated_gb"):
        print(f"GPU memory, max allocated per rank: {ph['cuda_max_allocated_gb']} GB")
    result.update(summary)


if __name__ == "__main__":
    sys.exit(main())
