"""Does the drafter draft? One command: regenerate data with the target, train a DFlash drafter for fixed
wall-clock budgets, export and reload each snapshot, and measure τ against prompt-lookup, losslessly.

Real target (one GPU; the SmolLM2 dir comes from `dflash-smollm2-prepare`):
    python trainer/benchmarks/proof_smollm2.py --target ~/.cache/dflash/smollm2-135m-instruct \
        --prompts prompts.jsonl --out runs/proof --minutes 1,2,4
CPU smoke test of the whole path (tiny random Qwen3 target, tiny tokenizer, synthetic chats):
    python trainer/benchmarks/proof_smollm2.py --tiny --out /tmp/proof-tiny

Several devices: --regen-devices cuda:0,cuda:1 splits the regeneration between them; --train-devices
cuda:0,cuda:1 trains data-parallel (proof_train.py); --eval-device evaluates the baseline and each snapshot
on its own device while the drafter trains (cuda:1 when training uses only cuda:0; or cpu).

Steps (each writes into --out; proof.json and proof.md are rewritten after every snapshot and evaluation):
  a) the prompts are split: the last --num-eval rows after a seeded shuffle are held out for evaluation;
  b) dflash-prepare-data --regenerate answers the others with the target (batched generate, time-capped
     by --regen-budget-s) into parquet shards, one preparation per regeneration device;
  c) one training run with the trainer's own step (dflash_trainer.step.drafter_micro_batch: anchors,
     block mask, chunked loss) whose learning rate and noise follow the wall clock (warmup then cosine
     over the largest budget); a checkpoint is saved when each budget in --minutes is reached
     (proof_train.py);
  d) each checkpoint is exported (dflash-export format) and reloaded from the export;
  e) dflash-eval's evaluation on the held-out prompts (proof_eval.py, inline or alongside training): the
     target's greedy decode (reference), prompt lookup, and each snapshot's drafter; τ, histogram,
     per-slot acceptance, losslessness.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch

from dflash_trainer.config import find_mask_token_id
from dflash_trainer.prepare_data import prepare

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder is not a package
import proof_eval  # noqa: E402
import proof_report  # noqa: E402
import proof_train  # noqa: E402

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


def split_prompts(path: str, out: str, num_eval: int, seed: int, shared: bool) -> tuple[str, str, int]:
    """The held-out split; with `shared` (another proof's --data-root) the files there must already hold
    exactly this split, and nothing is written."""
    with open(path) as f:
        rows = [line for line in f if line.strip()]
    random.Random(seed).shuffle(rows)
    if len(rows) <= num_eval:
        raise ValueError(f"--prompts has {len(rows)} rows; need more than --num-eval {num_eval}")
    train, held = rows[:-num_eval], rows[-num_eval:]
    paths = (os.path.join(out, "train_prompts.jsonl"), os.path.join(out, "eval_prompts.jsonl"))
    for p, part in zip(paths, (train, held)):
        write_split(p, part, shared)
    return paths[0], paths[1], len(train)


def write_split(path: str, lines: list[str], shared: bool) -> None:
    """Writes a prompt split file, unless it already holds exactly this; in another proof's --data-root
    (`shared`) it must, and nothing there is ever rewritten."""
    text = "".join(lines)
    if os.path.isfile(path):
        with open(path) as f:
            if f.read() == text:
                return
    if shared:
        raise ValueError(f"--data-root {os.path.dirname(path)} holds another prompt split (or none): use the same "
                         "--prompts, --num-eval, --seed and --regen-devices count as the proof that made it, "
                         "or leave --data-root out")
    with open(path, "w") as f:
        f.write(text)


def regenerate(args, train_prompts: str, out: str, devices: list[str], shared: bool) -> tuple[str, dict]:
    """The training data dir and its stats: one preparation per device (in parallel processes), each on a
    round-robin share of the prompts, gathered into one folder of links for TokenizedDataset."""
    kw = dict(max_seq_len=args.max_seq_len, rows_per_shard=args.regen_rows_per_shard, regenerate=True,
              temperature=args.temperature, max_new_tokens=args.regen_max_new_tokens,
              batch_size=args.regen_batch_size, engine="transformers", seed=args.seed,
              time_budget_s=-1.0 if shared else args.regen_budget_s, progress=False)  # shared: read only
    data_dir = os.path.join(out, "data")
    if len(devices) == 1:
        return data_dir, prepare(args.target, [train_prompts], data_dir, device=devices[0], **kw)
    with open(train_prompts) as f:
        rows = f.readlines()
    parts = []
    for i in range(len(devices)):
        parts.append(os.path.join(out, f"train_prompts-{i}.jsonl"))
        write_split(parts[-1], rows[i::len(devices)], shared)
    with ProcessPoolExecutor(len(devices), mp_context=get_context("spawn")) as pool:  # CUDA needs spawn
        futures = [pool.submit(prepare, args.target, [part], os.path.join(data_dir, f"part-{i}"), device=d, **kw)
                   for i, (part, d) in enumerate(zip(parts, devices))]
        part_stats = [f.result() for f in futures]
    joined = os.path.join(data_dir, "all")
    links = {f"part{i}-{name}": os.path.join("..", f"part-{i}", name) for i in range(len(devices))
             for name in os.listdir(os.path.join(data_dir, f"part-{i}")) if name.endswith(".parquet")}
    if not os.path.isdir(joined) or {n: os.readlink(os.path.join(joined, n)) for n in os.listdir(joined)} != links:
        shutil.rmtree(joined, ignore_errors=True)
        os.makedirs(joined)
        for name, to in links.items():
            os.symlink(to, os.path.join(joined, name))
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
    p.add_argument("--data-root", default=None,
                   help="where the prompt split and the regenerated data live (default --out); a second proof "
                        "given the first one's --out reuses its data (prepare-data's fingerprint checks that "
                        "prompts, split and settings are the same) and regenerates nothing")
    p.add_argument("--init-drafter", default=None,
                   help="start from these weights (an export dir or checkpoints/step-N of the same drafter shape)")
    p.add_argument("--regen-devices", default=None,
                   help="comma-separated, e.g. cuda:0,cuda:1: one regeneration process each (default: --device)")
    p.add_argument("--train-devices", default=None,
                   help="comma-separated, e.g. cuda:0,cuda:1: data-parallel training, one process each "
                        "(default: --device)")
    p.add_argument("--eval-device", default=None,
                   help="evaluate on this device (e.g. cuda:1) while training; default: after training, on --device")
    p.add_argument("--eval-threads", type=int, default=None, help="torch threads of a CPU evaluation worker")
    p.add_argument("--temperature", type=float, default=0.7, help="regeneration; 0 = greedy, like the evaluation")
    p.add_argument("--eager-layers", action="store_true",
                   help="do not compile the drafter layers (CUDA; run 3 trained so at 2.9 steps/s, "
                        "run 5 compiled at ~6.0)")
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
    args.regen_devices, args.train_devices = (
        [d.strip() for d in flag.split(",") if d.strip()] if flag else None
        for flag in (args.regen_devices, args.train_devices))
    if args.train_devices and len(set(args.train_devices)) != len(args.train_devices) \
            and any(d.startswith("cuda") for d in args.train_devices):
        p.error(f"--train-devices {','.join(args.train_devices)}: a GPU named twice; name each GPU once")
    for d in (args.regen_devices or []) + (args.train_devices or []) + [args.eval_device] * bool(args.eval_device):
        problem = device_problem(d)
        if problem:
            p.error(f"device {d!r}: {problem}")
    return args


def start_eval_worker(out: str, device: str, deadline_s: float | None, threads: int | None) -> subprocess.Popen:
    cmd = [sys.executable, proof_eval.__file__, "--out", out, "--device", device]
    if threads:
        cmd += ["--threads", str(threads)]
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
    try:
        return run(args)
    except ValueError as e:  # bad input found before the step that needs it changed anything
        print(f"proof_smollm2.py: error: {e}", file=sys.stderr)
        return 2


def run(args) -> int:
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.tiny and args.target is None:
        args.target, args.prompts = setup_tiny(out, 160)
    stage = {}
    t = time.time()
    data_root = os.path.abspath(args.data_root or out)
    os.makedirs(data_root, exist_ok=True)
    mask_id, mask_src = mask_token_for(args.target, args.mask_token_id)
    if args.init_drafter:  # a wrong warm start is refused before anything is written
        proof_train.initial_weights(args.init_drafter, proof_train.drafter_config(args, mask_id))
    shared = data_root != out
    train_prompts, eval_prompts, n_train = split_prompts(args.prompts, data_root, args.num_eval, args.seed, shared)
    log(f"{n_train} training prompts, {args.num_eval} held out; mask token {mask_id} from {mask_src}")
    train_devices = args.train_devices or [str(device)]
    data_dir, stats = regenerate(args, train_prompts, data_root, args.regen_devices or [str(device)], shared)
    stage["regenerate_s"] = round(time.time() - t, 1)
    log(f"data: {json.dumps(stats)}")
    if device.type == "cuda" and torch.cuda.is_initialized():  # only if this process generated (no new context)
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
               "init_drafter": args.init_drafter, "train_devices": train_devices,
               "eval_device": args.eval_device or str(device), "data": stats, "snapshots": [], "stage_s": stage,
               "args": vars(args)}
    worker = start_eval_worker(out, args.eval_device, args.deadline_s, args.eval_threads) if args.eval_device else None

    t = time.time()
    results["snapshots"] = proof_train.run_training(args, data_dir, mask_id, out, train_devices, results, T0)
    stage["train_s"] = round(time.time() - t, 1)
    for key in ("replicas", "curve"):  # written by rank 0, which may have been another process
        path = os.path.join(out, "train", f"{key}.json")
        if os.path.isfile(path):
            with open(path) as f:
                results[key] = json.load(f)
    proof_eval.mark_training_done(out)
    proof_report.write_results(out, results)  # the training record survives even if evaluation runs out of time
    t = time.time()
    if worker is not None:
        finish_eval_worker(worker, args.deadline_s)
    proof_eval.run_inline(out, device, None if args.deadline_s is None else T0 + args.deadline_s, log)
    stage["eval_after_training_s"] = round(time.time() - t, 1)
    proof_eval.merge(out, results)
    for snap in results["snapshots"]:
        snap.setdefault("eval", None)
    stage["total_s"] = round(time.time() - T0, 1)
    proof_report.write_results(out, results)
    log(f"results: {os.path.join(out, 'proof.md')}")
    print(open(os.path.join(out, "proof.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
