"""Does the drafter draft? One command: regenerate data with the target, train a DFlash drafter for fixed
wall-clock budgets, export and reload each snapshot, and measure τ against prompt-lookup, losslessly.

Real target (one GPU; the SmolLM2 dir comes from `dflash-smollm2-prepare`):
    python trainer/benchmarks/proof_smollm2.py --target ~/.cache/dflash/smollm2-135m-instruct \
        --prompts prompts.jsonl --out runs/proof --minutes 1,2,4
CPU smoke test of the whole path (tiny random Qwen3 target, tiny tokenizer, synthetic chats):
    python trainer/benchmarks/proof_smollm2.py --tiny --out /tmp/proof-tiny

Two GPUs: --regen-devices cuda:0,cuda:1 splits the regeneration between them, and --eval-device cuda:1
evaluates the baseline and each snapshot on the second GPU while the drafter trains on the first.

Steps (each writes into --out; proof.json and proof.md are rewritten after every snapshot and evaluation):
  a) the prompts are split: the last --num-eval rows after a seeded shuffle are held out for evaluation;
  b) dflash-prepare-data --regenerate answers the others with the target (batched generate, time-capped
     by --regen-budget-s) into parquet shards, one preparation per regeneration device;
  c) one training run with the trainer's own step (dflash_trainer.step.drafter_micro_batch: anchors,
     block mask, chunked loss) whose learning rate and noise follow the wall clock (warmup then cosine
     over the largest budget); a checkpoint is saved when each budget in --minutes is reached;
  d) each checkpoint is exported (dflash-export format) and reloaded from the export;
  e) dflash-eval's evaluation on the held-out prompts (proof_eval.py, inline or alongside training): the
     target's greedy decode (reference), prompt lookup, and each snapshot's drafter; τ, histogram,
     per-slot acceptance, losslessness.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch

from dflash_trainer.checkpoint import save_checkpoint
from dflash_trainer.config import default_target_layer_ids, find_mask_token_id
from dflash_trainer.data import BatchLoader, TokenizedDataset
from dflash_trainer.drafter import DrafterConfig
from dflash_trainer.loss import acceptance_proxy
from dflash_trainer.prepare_data import prepare
from dflash_trainer.step import derived_seed, drafter_micro_batch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder is not a package
import proof_eval  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f} s] {msg}", flush=True)


def setup_tiny(out: str, num_chats: int) -> tuple[str, str]:
    from dflash_trainer.make_tiny import write_target
    from dflash_trainer.tiny_tokenizer import save_tokenizer, synthetic_chats
    target = os.path.join(out, "tiny_target")
    if not os.path.isfile(os.path.join(target, "config.json")):
        write_target(target, seed=0)
        save_tokenizer(target)
    prompts = os.path.join(out, "tiny_prompts.jsonl")
    with open(prompts, "w") as f:
        for row in synthetic_chats(num_chats, seed=0):
            f.write(json.dumps({"messages": row["messages"][:1]}) + "\n")
    return target, prompts


def split_prompts(path: str, out: str, num_eval: int, seed: int) -> tuple[str, str, int]:
    with open(path) as f:
        rows = [line for line in f if line.strip()]
    random.Random(seed).shuffle(rows)
    if len(rows) <= num_eval:
        raise ValueError(f"--prompts has {len(rows)} rows; need more than --num-eval {num_eval}")
    train, held = rows[:-num_eval], rows[-num_eval:]
    paths = (os.path.join(out, "train_prompts.jsonl"), os.path.join(out, "eval_prompts.jsonl"))
    for p, part in zip(paths, (train, held)):
        with open(p, "w") as f:
            f.writelines(part)
    return paths[0], paths[1], len(train)


def regenerate(args, train_prompts: str, out: str, devices: list[str]) -> tuple[str, dict]:
    """The training data dir and its stats: one preparation per device (in parallel processes), each on a
    round-robin share of the prompts, gathered into one folder of links for TokenizedDataset."""
    kw = dict(max_seq_len=args.max_seq_len, rows_per_shard=args.regen_rows_per_shard, regenerate=True,
              temperature=args.temperature, max_new_tokens=args.regen_max_new_tokens,
              batch_size=args.regen_batch_size, engine="transformers", seed=args.seed,
              time_budget_s=args.regen_budget_s, progress=False)
    data_dir = os.path.join(out, "data")
    if len(devices) == 1:
        return data_dir, prepare(args.target, [train_prompts], data_dir, device=devices[0], **kw)
    with open(train_prompts) as f:
        rows = f.readlines()
    parts = []
    for i in range(len(devices)):
        parts.append(os.path.join(out, f"train_prompts-{i}.jsonl"))
        with open(parts[-1], "w") as f:
            f.writelines(rows[i::len(devices)])
    with ProcessPoolExecutor(len(devices), mp_context=get_context("spawn")) as pool:  # CUDA needs spawn
        futures = [pool.submit(prepare, args.target, [part], os.path.join(data_dir, f"part-{i}"), device=d, **kw)
                   for i, (part, d) in enumerate(zip(parts, devices))]
        part_stats = [f.result() for f in futures]
    joined = os.path.join(data_dir, "all")
    shutil.rmtree(joined, ignore_errors=True)
    os.makedirs(joined)
    for i in range(len(devices)):
        for name in sorted(os.listdir(os.path.join(data_dir, f"part-{i}"))):
            if name.endswith(".parquet"):
                os.symlink(os.path.join("..", f"part-{i}", name), os.path.join(joined, f"part{i}-{name}"))
    stats = {k: sum(st[k] for st in part_stats) for k in part_stats[0] if isinstance(part_stats[0][k], int)
             and not isinstance(part_stats[0][k], bool)}
    stats["bad"] = {}
    for st in part_stats:
        for reason, n in st["bad"].items():
            stats["bad"][reason] = stats["bad"].get(reason, 0) + n
    stats.update(complete=all(st["complete"] for st in part_stats), devices=devices)
    return joined, stats


def mask_token_for(target: str, flag: int | None) -> tuple[int, str]:
    if flag is not None:
        return flag, "--mask-token-id"
    marker = os.path.join(target, "dflash_smollm2.json")
    if os.path.isfile(marker):
        info = json.load(open(marker))
        return int(info["mask_token_id"]), f"{info['mask_token']} (dflash_trainer.smollm2)"
    found = find_mask_token_id(target)
    if found is None:
        raise ValueError("no mask token known for this target; pass --mask-token-id")
    return found, "<|MASK|> (added_tokens.json)"


def lr_factor(frac: float, warmup: float) -> float:
    if frac < warmup:
        return max(frac / warmup, 1e-3)
    return 0.5 * (1 + math.cos(math.pi * min((frac - warmup) / (1 - warmup), 1.0)))


def train_timed(args, target_dir: str, data_dir: str, mask_id: int, out: str, device: torch.device,
                on_snapshot) -> list[dict]:
    """One run; learning rate and noise follow elapsed/total time; a checkpoint at each budget, announced
    in train/snapshots.jsonl (for the evaluation worker) and passed to on_snapshot."""
    from transformers import AutoConfig

    from dflash_trainer.target import FrozenTarget
    from dflash_trainer.train import training_drafter
    torch.manual_seed(args.seed)
    tconf = AutoConfig.from_pretrained(target_dir)
    layer_ids = default_target_layer_ids(getattr(tconf, "text_config", tconf).num_hidden_layers, args.taps)
    cfg = DrafterConfig.from_target(tconf, args.layers, layer_ids, args.block_size, mask_id)
    dataset = TokenizedDataset(data_dir, args.max_seq_len)
    loader = BatchLoader(dataset, args.seed, args.token_budget, args.max_batch_size)
    target = FrozenTarget(target_dir, device, layer_ids, need_last_hidden=args.soft_labels)
    drafter = training_drafter(cfg, target, device)  # as dflash-train builds it (compiled layers on CUDA)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    n_mask = sum(int((dataset.row(i)[0] == mask_id).sum()) for i in range(len(dataset))) \
        if hasattr(dataset, "row") else sum(int((ids == mask_id).sum()) for ids in dataset.input_ids)
    log(f"train: {len(dataset)} sequences, {int(dataset.lengths.sum())} tokens "
        f"({dataset.num_supervised_tokens} supervised), mask token {mask_id} occurs {n_mask} times in the data; "
        f"drafter {args.layers} layers, block {args.block_size}, taps {layer_ids}, "
        f"{'soft (KL to the target)' if args.soft_labels else 'hard'} labels, lr {args.lr}, "
        f"{sum(p.numel() for p in params) / 1e6:.2f} M params; budgets {args.minutes} min on {device}")
    budgets = sorted(args.minutes)
    total_s = budgets[-1] * 60
    snapshots, step, window = [], 0, []
    drafter.train()
    t_warm = time.time()
    for i in range(args.warmup_batches):  # compile flex attention outside the timed budget; no update
        batch = loader.next_batch()
        taps, last = target(batch.input_ids)
        drafter_micro_batch(drafter, taps, last, batch.input_ids, batch.loss_mask, batch.lengths,
                            max_anchors=args.max_anchors, gamma=args.gamma, noise_amplitude=0.0,
                            seed=derived_seed(args.seed, -1 - i), head_chunk_size=4096).loss.backward()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if args.warmup_batches:
        log(f"warm-up (compile) {args.warmup_batches} batches, not trained on: {time.time() - t_warm:.1f} s")
    t_start = time.time()
    while budgets:
        elapsed = time.time() - t_start
        frac = elapsed / total_s
        for g in opt.param_groups:
            g["lr"] = args.lr * lr_factor(frac, args.warmup)
        amp = args.noise_start + (args.noise_end - args.noise_start) * min(frac, 1.0)
        batch = loader.next_batch()
        taps, last = target(batch.input_ids)
        out_ = drafter_micro_batch(drafter, taps, last, batch.input_ids, batch.loss_mask, batch.lengths,
                                   max_anchors=args.max_anchors, gamma=args.gamma, noise_amplitude=amp,
                                   seed=derived_seed(args.seed, step), head_chunk_size=4096)
        out_.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        window.append((out_.loss.detach(), out_.slot_correct.detach(), out_.slot_count.detach()))
        if step % args.log_every == 0 or time.time() - t_start >= budgets[0] * 60:
            loss = float(torch.stack([w[0] for w in window]).mean())  # one sync per log line
            acc = (sum(w[1] for w in window) / sum(w[2] for w in window).clamp(min=1)).tolist()
            window = []
            log(f"step {step} epoch {loader.epoch} {time.time() - t_start:6.1f} s loss {loss:.4f} acc1 {acc[1]:.3f} "
                f"tau_proxy {acceptance_proxy(acc):.2f} lr {opt.param_groups[0]['lr']:.2e}")
            if time.time() - t_start >= budgets[0] * 60:
                minutes = budgets.pop(0)
                path = save_checkpoint(os.path.join(out, "train"), step, drafter.trainable_state_dict(),
                                       cfg.to_dict(), {"step": step, "minutes": minutes}, keep=100)
                snapshots.append({"minutes": minutes, "step": step, "wall_s": round(time.time() - t_start, 1),
                                  "epoch": loader.epoch, "loss": loss, "slot_acc": [round(a, 4) for a in acc],
                                  "tau_proxy": acceptance_proxy(acc), "checkpoint": path})
                log(f"snapshot at {minutes} min: step {step}, {path}")
                proof_eval.record_snapshot(out, snapshots[-1])
                on_snapshot(snapshots)
    del target
    return snapshots


def write_results(out: str, results: dict) -> None:
    report_dir = results["args"].get("report_dir")
    for d in [out] + ([report_dir] if report_dir else []):
        _write_results(d, results)


def _write_results(out: str, results: dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "proof.json"), "w") as f:
        json.dump(results, f, indent=2)
    base = results.get("baseline") or {}
    lines = [f"# DFlash proof: {results['target']}", "",
             f"block {results['block_size']}, {results['layers']} draft layers, mask token {results['mask_token']}, "
             f"{results['num_eval_prompts']} held-out prompts, <= {results['eval_max_new_tokens']} new tokens, "
             f"greedy, target {results['eval_dtype']} on {results['device']}", "",
             "| drafter | training min | steps | τ | τ / prompt-lookup | tokens/target fwd | lossless | train τ proxy |",
             "|---|---|---|---|---|---|---|---|"]
    if base:
        lines.append(f"| prompt lookup (n<=3) | - | - | {base['tau']:.2f} | 1.00 | "
                     f"{base['tokens_per_target_forward']:.2f} | {'yes' if base['lossless'] else 'NO'} | - |")
    for s in results["snapshots"]:
        m = s.get("eval")
        if not m:
            continue
        ratio = m["tau"] / base["tau"] if base else float("nan")
        lines.append(f"| DFlash | {s['minutes']} | {s['step']} | {m['tau']:.2f} | {ratio:.2f} | "
                     f"{m['tokens_per_target_forward']:.2f} | {'yes' if m['lossless'] else 'NO'} | "
                     f"{s['tau_proxy']:.2f} |")
    for s in results["snapshots"]:
        if s.get("eval"):
            hist = ", ".join(f"{k}: {v}" for k, v in s["eval"]["accept_length_histogram"].items() if v)
            lines += ["", f"accept-length histogram after {s['minutes']} min: {hist}",
                      f"per-slot acceptance: {' '.join(f'{x:.2f}' for x in s['eval']['slot_accept_rate'])}"]
    if base:
        hist = ", ".join(f"{k}: {v}" for k, v in base["accept_length_histogram"].items() if v)
        lines += ["", f"prompt-lookup histogram: {hist}"]
    lines += ["", f"data: {json.dumps(results.get('data', {}))}", f"stages: {json.dumps(results['stage_s'])}"]
    with open(os.path.join(out, "proof.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def device_problem(name: str) -> str | None:
    try:
        d = torch.device(name)
    except RuntimeError:
        return "not a device name; use cpu, cuda or cuda:N"
    if d.type == "cuda" and (not torch.cuda.is_available() or (d.index or 0) >= torch.cuda.device_count()):
        return f"this machine has {torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA devices"
    return None


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="HF target dir (e.g. from dflash-smollm2-prepare)")
    p.add_argument("--prompts", help="chat JSONL of prompts (proof_prompts.py builds one)")
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny target, tokenizer and chats")
    p.add_argument("--minutes", default=None, help="comma-separated training budgets (default 1,2,4; tiny 0.1,0.25)")
    p.add_argument("--num-eval", type=int, default=24)
    p.add_argument("--eval-max-new-tokens", type=int, default=192)
    p.add_argument("--regen-max-new-tokens", type=int, default=384)
    p.add_argument("--regen-batch-size", type=int, default=512)
    p.add_argument("--regen-budget-s", type=float, default=120.0, help="stop starting new shards after this")
    p.add_argument("--regen-rows-per-shard", type=int, default=512)
    p.add_argument("--regen-devices", default=None,
                   help="comma-separated, e.g. cuda:0,cuda:1: one regeneration process each (default: --device)")
    p.add_argument("--eval-device", default=None,
                   help="evaluate on this device (e.g. cuda:1) while training; default: after training, on --device")
    p.add_argument("--temperature", type=float, default=0.7, help="regeneration; 0 = greedy, like the evaluation")
    p.add_argument("--soft-labels", action="store_true", help="KL to the target's distribution instead of CE")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--taps", type=int, default=5)
    p.add_argument("--gamma", type=float, default=7.0)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=float, default=0.04, help="fraction of the largest budget")
    p.add_argument("--noise-start", type=float, default=0.05)
    p.add_argument("--noise-end", type=float, default=0.01)
    p.add_argument("--token-budget", type=int, default=32768)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--max-anchors", type=int, default=256)
    p.add_argument("--mask-token-id", type=int, default=None)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--warmup-batches", type=int, default=2, help="untimed compile batches before the clock")
    p.add_argument("--report-dir", default=None, help="also write proof.json/proof.md here (e.g. $OUT)")
    p.add_argument("--deadline-s", type=float, default=None, help="skip remaining evaluations after this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = p.parse_args(argv)
    if args.tiny:
        for k, v in dict(minutes=None, num_eval=min(args.num_eval, 4),
                         eval_max_new_tokens=min(args.eval_max_new_tokens, 24), regen_max_new_tokens=24,
                         regen_batch_size=32, regen_rows_per_shard=64, block_size=min(args.block_size, 8),
                         layers=min(args.layers, 1), token_budget=1024, max_batch_size=8, max_seq_len=256,
                         max_anchors=32, gamma=4.0, lr=3e-3, log_every=10,
                         # greedy answers of the random tiny target are a deterministic function to learn
                         temperature=0.0).items():
            if k != "minutes":
                setattr(args, k, v)
        args.minutes = args.minutes or "0.1,0.25"
    elif not (args.target and args.prompts):
        p.error("--target and --prompts are required without --tiny")
    args.minutes = [float(x) for x in (args.minutes or "1,2,4").split(",")]
    args.regen_devices = [d.strip() for d in args.regen_devices.split(",") if d.strip()] \
        if args.regen_devices else None
    for d in (args.regen_devices or []) + [args.eval_device] * bool(args.eval_device):
        problem = device_problem(d)
        if problem:
            p.error(f"device {d!r}: {problem}")
    return args


def start_eval_worker(out: str, device: str, deadline_s: float | None) -> subprocess.Popen:
    cmd = [sys.executable, proof_eval.__file__, "--out", out, "--device", device]
    if deadline_s is not None:
        cmd += ["--deadline-epoch", str(T0 + deadline_s)]
    log(f"evaluation worker on {device}: {' '.join(cmd)}")
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL)  # its lines go to this process's stdout


def finish_eval_worker(worker: subprocess.Popen, deadline_s: float | None) -> None:
    """Wait for the worker until the deadline; whatever it leaves undone is evaluated inline after."""
    timeout = None if deadline_s is None else max(deadline_s - (time.time() - T0), 0) + 60
    try:
        rc = worker.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        rc = worker.wait()
    if rc != 0:
        log(f"evaluation worker exited with {rc}; the rest is evaluated here")


def main(argv=None) -> int:
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.tiny and args.target is None:
        args.target, args.prompts = setup_tiny(out, 160)
    stage = {}
    t = time.time()
    train_prompts, eval_prompts, n_train = split_prompts(args.prompts, out, args.num_eval, args.seed)
    mask_id, mask_src = mask_token_for(args.target, args.mask_token_id)
    log(f"{n_train} training prompts, {args.num_eval} held out; mask token {mask_id} from {mask_src}")
    data_dir, stats = regenerate(args, train_prompts, out, args.regen_devices or [str(device)])
    stage["regenerate_s"] = round(time.time() - t, 1)
    log(f"data: {json.dumps(stats)}")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    # budgets are measured from a fresh start, and no result of an earlier run may be merged into this one
    for stale in ("train", "eval"):
        shutil.rmtree(os.path.join(out, stale), ignore_errors=True)
    os.makedirs(os.path.join(out, "train"))
    proof_eval.write_settings(out, {"target": args.target, "eval_prompts": eval_prompts,
                                    "block_size": args.block_size, "max_new_tokens": args.eval_max_new_tokens})
    results = {"target": args.target, "block_size": args.block_size, "layers": args.layers,
               "mask_token": f"{mask_id} ({mask_src})", "num_eval_prompts": args.num_eval,
               "eval_max_new_tokens": args.eval_max_new_tokens, "eval_dtype": "float32", "device": str(device),
               "eval_device": args.eval_device or str(device), "data": stats, "snapshots": [], "stage_s": stage,
               "args": vars(args)}
    worker = start_eval_worker(out, args.eval_device, args.deadline_s) if args.eval_device else None

    def on_snapshot(snapshots: list[dict]) -> None:  # the record so far, with whatever the worker finished
        results["snapshots"] = snapshots
        proof_eval.merge(out, results)
        write_results(out, results)

    t = time.time()
    results["snapshots"] = train_timed(args, args.target, data_dir, mask_id, out, device, on_snapshot)
    stage["train_s"] = round(time.time() - t, 1)
    proof_eval.mark_training_done(out)
    write_results(out, results)  # the training record survives even if evaluation runs out of time
    t = time.time()
    if worker is not None:
        finish_eval_worker(worker, args.deadline_s)
    proof_eval.run_inline(out, device, None if args.deadline_s is None else T0 + args.deadline_s, log)
    stage["eval_after_training_s"] = round(time.time() - t, 1)
    proof_eval.merge(out, results)
    for snap in results["snapshots"]:
        snap.setdefault("eval", None)
    stage["total_s"] = round(time.time() - T0, 1)
    write_results(out, results)
    log(f"results: {os.path.join(out, 'proof.md')}")
    print(open(os.path.join(out, "proof.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
