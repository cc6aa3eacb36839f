"""Does the drafter draft? One command: regenerate data with the target, train a DFlash drafter with
`dflash-train` for a wall-clock budget, export and reload each snapshot, and measure τ against prompt-lookup,
losslessly. This script is a driver: the training is dflash-train's own loop, run as a subprocess, and every
trainer flag (--block-size, --use-soft-labels, --time-budget-min, ...) is dflash-train's, with its default.

Real target (one GPU; the SmolLM2 dir comes from `dflash-smollm2-prepare`), the SmolLM2 proof's settings:
    python -m proofs.proof_smollm2 --target-model ~/.cache/dflash/smollm2-135m-instruct \
        --prompts prompts.jsonl --out runs/proof --device cuda --time-budget-min 10 --snapshot-minutes 2,5 \
        --block-size 16 --gamma 7 --num-draft-layers 5 --max-anchors 256 --token-budget 32768 \
        --max-seq-len 1024 --grad-accum 1 --lr 1e-3 --use-soft-labels --epochs 100 --log-interval 50 \
        --checkpoint-interval 100000 --compile-warmup-batches 2
CPU smoke test of the whole path (tiny random Qwen3 target, tiny tokenizer, synthetic chats, TINY_TRAIN_ARGV):
    python -m proofs.proof_smollm2 --tiny --out /tmp/proof-tiny

Several devices: --regen-devices cuda:0,cuda:1 splits the regeneration between them; --eval-device evaluates
the baseline and each snapshot on its own device while the drafter trains (e.g. cpu, or a second GPU).
Training is one dflash-train process (its --device, --target-gpus, --drafter-gpus).

Steps (each writes into --out; proof.json and proof.md are rewritten while training runs and after each evaluation):
  a) the prompts are split: the last --num-eval rows after a seeded shuffle (--seed) are held out for evaluation;
  b) dflash-prepare-data --regenerate answers the others with the target (batched generate, time-capped
     by --regen-budget-s) into parquet shards, one preparation per regeneration device;
     With --synthesize-prompts N, dflash-synthesize-prompts first has the target write N prompts of its own
     (kept apart from both held-out sets), answered the same way and trained on beside the others; with
     --extra-prompts FILE (e.g. proofs/extra_prompts.py's prompt sets) that file's prompts too;
  c) dflash-train --output-dir OUT/train --time-budget-min M --snapshot-minutes ...: one run whose learning rate
     and noise follow the training time over the budget; it keeps a checkpoint at each snapshot minute and at
     the end of the budget (OUT/train/snapshots/<M>min, listed in OUT/train/snapshots.jsonl);
  d) each snapshot is exported (dflash-export format) and reloaded from the export;
  e) dflash-eval's evaluation on two held-out sets (proof_eval.py, inline or alongside training): the split of a),
     and the other-styles set (--other-styles, default the trainer's own: prompts unlike anything the proof trains
     on, which prepare-data keeps out of the data); per set the target's greedy decode (reference), prompt lookup,
     and each snapshot's drafter; τ, histogram, per-slot acceptance, losslessness. The report shows both τ.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from dflash_trainer import cli
from dflash_trainer.config import find_mask_token_id
from dflash_trainer.prep.generate import add_decoding_flags, decoding_of
from dflash_trainer.prep.heldout import OTHER_STYLES, load_prompts
from dflash_trainer.prep.prepare_data import add_regeneration_flags, check_regeneration, prepare
from dflash_trainer.prep.synthesize import read_system_prompts, synthesize_defaults, synthesize_prompts

from . import proof_eval, proof_report
from .stale_answers import set_aside_other_prompts

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f} s] {msg}", flush=True)


def setup_tiny(out: str, num_chats: int) -> tuple[str, str]:
    from dflash_trainer.prep.make_tiny import write_target
    from dflash_trainer.prep.tiny_tokenizer import save_tokenizer, synthetic_chats
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


def regen_kwargs(args, cfg, shared: bool) -> dict:
    """prepare()'s settings for every regeneration of this proof."""
    return dict(max_seq_len=cfg.max_seq_len, rows_per_shard=args.regen_rows_per_shard, regenerate=True,
                temperature=args.temperature, max_new_tokens=args.regen_max_new_tokens,
                batch_size=args.regen_batch_size, engine="transformers", seed=cfg.seed,
                time_budget_s=-1.0 if shared else args.regen_budget_s, progress=False,  # shared: read only
                held_out=(args.other_styles,),  # refused from the training data (the trainer's own set always is)
                decoding=decoding_of(args, prefix="regen-"))


def link_shards(shards: dict[str, str], joined: str) -> None:
    """`joined` as a folder of links, one per (name -> shard path), remade only when it holds other links."""
    links = {name: os.path.relpath(os.path.realpath(path), os.path.realpath(joined)) for name, path in shards.items()}
    if not os.path.isdir(joined) or {n: os.readlink(os.path.join(joined, n)) for n in os.listdir(joined)} != links:
        shutil.rmtree(joined, ignore_errors=True)
        os.makedirs(joined)
        for name, to in links.items():
            os.symlink(to, os.path.join(joined, name))


def parquet_shards(folder: str) -> list[str]:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".parquet"))


def regenerate(args, cfg, train_prompts: str, out: str, devices: list[str], shared: bool) -> tuple[str, dict]:
    """The training data dir and its stats: one preparation per device (in parallel processes), each on a
    round-robin share of the prompts, gathered into one folder of links for TokenizedDataset."""
    kw = regen_kwargs(args, cfg, shared)
    data_dir = os.path.join(out, "data")
    if len(devices) == 1:
        return data_dir, prepare(cfg.target_model, [train_prompts], data_dir, device=devices[0], **kw)
    with open(train_prompts) as f:
        rows = f.readlines()
    parts = []
    for i in range(len(devices)):
        parts.append(os.path.join(out, f"train_prompts-{i}.jsonl"))
        write_split(parts[-1], rows[i::len(devices)], shared)
    threads = cpu_share(sum(torch.device(d).type == "cpu" for d in devices))
    with ProcessPoolExecutor(len(devices), mp_context=get_context("spawn")) as pool:  # CUDA needs spawn
        futures = [pool.submit(prepare_with_threads, threads if torch.device(d).type == "cpu" else None,
                               cfg.target_model, [part], os.path.join(data_dir, f"part-{i}"), device=d, **kw)
                   for i, (part, d) in enumerate(zip(parts, devices))]
        part_stats = [f.result() for f in futures]
    joined = os.path.join(data_dir, "all")
    link_shards({f"part{i}-{os.path.basename(path)}": path for i in range(len(devices))
                 for path in parquet_shards(os.path.join(data_dir, f"part-{i}"))}, joined)
    stats = {k: sum(st[k] for st in part_stats) for k in part_stats[0] if isinstance(part_stats[0][k], int)
             and not isinstance(part_stats[0][k], bool)}
    stats["bad"] = {}
    for st in part_stats:
        for reason, n in st["bad"].items():
            stats["bad"][reason] = stats["bad"].get(reason, 0) + n
    stats.update(complete=all(st["complete"] for st in part_stats), devices=devices)
    return joined, stats


def add_synthesized(args, cfg, out: str, data_dir: str, stats: dict, eval_prompts: str, device: str,
                    shared: bool) -> tuple[str, dict]:
    """--synthesize-prompts N: prompts the target writes itself (dflash-synthesize-prompts, its defaults but the
    batch and --synthesize-temperature), kept apart from both held-out sets, answered like the others (its own
    preparation, data/synth) and trained on beside them (data/with-synth: links to both preparations' shards).
    Returns (data dir, stats)."""
    prompts = os.path.join(out, "data", "synth-prompts.jsonl")
    synth = synthesize_prompts(cfg.target_model, prompts, args.synthesize_prompts, batch_size=args.regen_batch_size,
                               temperature=args.synthesize_temperature, device=device, seed=cfg.seed,
                               held_out=(args.other_styles, eval_prompts),
                               time_budget_s=args.regen_budget_s, system_prompts=args.synthesize_system_prompts,
                               reuse_only=shared, log=log, decoding=decoding_of(args, prefix="regen-"))
    log(f"synthesized prompts: {json.dumps(synth)}")
    synth_dir = os.path.join(out, "data", "synth")
    if not shared:  # a carried data/synth of another synthesis (another --synthesize-prompts): set aside, kept
        set_aside_other_prompts(synth_dir, prompts, log=log)
    answered = prepare(cfg.target_model, [prompts], synth_dir, device=device, **regen_kwargs(args, cfg, shared))
    return beside(out, data_dir, "synth", synth_dir), dict(stats, synthesized={"prompts": synth, "data": answered})


def add_extra(args, cfg, out: str, data_dir: str, stats: dict, eval_prompts: str, device: str,
              shared: bool) -> tuple[str, dict]:
    """--extra-prompts FILE: another prompt set, answered like the others (its own preparation, data/extra; rows that
    overlap either held-out set refused) and trained on beside them. Returns (data dir, stats)."""
    extra_dir, extra_prompts = os.path.join(out, "data", "extra"), os.path.abspath(args.extra_prompts)
    if not shared:  # a carried data/extra of another --extra-prompts file: set aside, kept
        set_aside_other_prompts(extra_dir, extra_prompts, log=log)
    kw = dict(regen_kwargs(args, cfg, shared), held_out=(args.other_styles, eval_prompts))
    answered = prepare(cfg.target_model, [extra_prompts], extra_dir, device=device, **kw)
    return beside(out, data_dir, "extra", extra_dir), dict(stats, extra=answered)


def beside(out: str, data_dir: str, name: str, other_dir: str) -> str:
    """data/with-<names>: a folder of links to data_dir's shards and other_dir's (named <name>-<shard>), what
    dflash-train reads to train on both (with-synth, with-extra, with-synth-extra)."""
    base = os.path.basename(data_dir)
    joined = os.path.join(out, "data", f"{base}-{name}" if base.startswith("with-") else f"with-{name}")
    link_shards({**{os.path.basename(p): p for p in parquet_shards(data_dir)},
                 **{f"{name}-{os.path.basename(p)}": p for p in parquet_shards(other_dir)}}, joined)
    return joined


def cpu_share(processes: int) -> int:
    """torch threads for each of `processes` processes computing on the CPU at once: this process's threads (a
    thread per core, or OMP_NUM_THREADS) split between them. torch's default in each, a thread per core, would
    oversubscribe the cores: on 2 cores the tiny proof's two regeneration processes, and its training beside a CPU
    evaluation worker, ran about ten times slower (OpenMP threads spinning for a core)."""
    return max(1, torch.get_num_threads() // max(processes, 1))


def prepare_with_threads(threads: int | None, *args, **kw) -> dict:
    """prepare() in a regeneration process, with `threads` torch threads (None: torch's default)."""
    if threads:
        torch.set_num_threads(threads)
    return prepare(*args, **kw)


def mask_token_for(target: str, flag: int | None) -> tuple[int, str]:
    if flag is not None:
        return flag, "--mask-token-id"
    marker = os.path.join(target, "dflash_smollm2.json")
    if os.path.isfile(marker):
        info = json.load(open(marker))
        return int(info["mask_token_id"]), f"{info['mask_token']} (dflash_trainer.prep.smollm2)"
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


# The tiny smoke shape (--tiny): a command line for dflash-train, given before the user's flags (which win).
TINY_TRAIN_ARGV = ["--block-size", "8", "--num-draft-layers", "1", "--token-budget", "1024", "--max-batch-size", "8",
                   "--max-seq-len", "256", "--max-anchors", "32", "--gamma", "4", "--lr", "3e-3", "--grad-accum", "1",
                   "--epochs", "1000", "--log-interval", "10", "--time-budget-min", "0.25"]
# Set by this driver, not handed on from its command line.
DRIVER_SET = ("data_dir", "output_dir", "run_dir", "target_model", "mask_token_id")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("proof")
    g.add_argument("--prompts", help="chat JSONL of prompts (proof_prompts.py builds one)")
    g.add_argument("--out", required=True)
    g.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny target, tokenizer and chats")
    g.add_argument("--num-eval", type=int, default=24)
    g.add_argument("--other-styles", default=OTHER_STYLES,
                   help="the second held-out set: JSONL prompts unlike the training prompts (default: the trainer's "
                        "own, prep/other_styles.jsonl); kept out of the regenerated data")
    g.add_argument("--num-other-styles", type=int, default=None,
                   help="evaluate only the first N of them (default all)")
    g.add_argument("--eval-max-new-tokens", type=int, default=192)
    g.add_argument("--regen-budget-s", type=float, default=120.0,
                   help="stop starting new shards (and new synthesis batches) after this")
    g.add_argument("--synthesize-prompts", type=int, default=0, metavar="N",
                   help="also train on N prompts the target writes itself (dflash-synthesize-prompts with its "
                        "defaults, batch --regen-batch-size), never on either held-out set (default 0: none)")
    g.add_argument("--synthesize-system-prompts", default=None, metavar="FILE",
                   help="dflash-synthesize-prompts' --system-prompts for those prompts: system messages, one per "
                        "line, that steer what the target asks (the trainer ships one: prep/synthesis_systems.txt)")
    g.add_argument("--synthesize-temperature", type=float, default=synthesize_defaults()["temperature"], metavar="T",
                   help="dflash-synthesize-prompts' --temperature for those prompts (its default): below 1 a small "
                        "target writes fewer garbled requests (PROOF.md, twenty-ninth session)")
    g.add_argument("--eval-replay", action="store_true",
                   help="evaluate each snapshot, and the baseline's prompt lookup, by replaying the decode over "
                        "the baseline's references (dflash-eval --replay: the same τ in seconds, losslessness not "
                        "checked, the report says `replayed`): for ablations; a run whose losslessness counts "
                        "decodes")
    g.add_argument("--extra-prompts", default=None, metavar="FILE",
                   help="also train on this file's prompts (JSONL chat rows {\"messages\": [...]}, e.g. written by "
                        "python -m proofs.extra_prompts --out FILE), answered like the others, never on either "
                        "held-out set (default: none)")
    g.add_argument("--data-root", default=None,
                   help="where the prompt split and the regenerated data live (default --out); a second proof "
                        "given the first one's --out reuses its data (prepare-data's fingerprint checks that "
                        "prompts, split and settings are the same) and regenerates nothing")
    g.add_argument("--regen-devices", default=None,
                   help="comma-separated, e.g. cuda:0,cuda:1: one regeneration process each (default: --device)")
    g.add_argument("--eval-device", default=None,
                   help="evaluate on this device (e.g. cpu or cuda:1) while training; default: after training, on "
                        "--device")
    g.add_argument("--eval-workers", type=int, default=1,
                   help="decode the evaluation's prompts in this many processes on its device (dflash-eval "
                        "--workers: the same figures, sooner; default 1)")
    g.add_argument("--eval-threads", type=int, default=None,
                   help="torch threads of a CPU evaluation worker (default: half the cores when training is on the "
                        "CPU too, else torch's own)")
    g.add_argument("--report-dir", default=None, help="also write proof.json/proof.md here (e.g. $OUT)")
    g.add_argument("--deadline-s", type=float, default=None, help="skip remaining evaluations after this")
    # dflash-prepare-data's regeneration flags (its declaration), as --regen-*; the proof's own defaults, in the
    # open: the values it had before the declaration was shared (a GPU's batch and shard; its runs pass their own)
    add_regeneration_flags(g, prefix="regen-")
    add_decoding_flags(g, prefix="regen-")  # (the generator's: its defaults, as dflash-prepare-data's)
    p.set_defaults(regen_max_new_tokens=384, regen_batch_size=512, regen_rows_per_shard=512)
    # dflash-train's own flags (its declaration, its defaults); --seed also seeds the split and the regeneration,
    # --max-seq-len also caps the regenerated rows, --block-size is also the evaluation's block
    cli.add_train_flags(p, skip=DRIVER_SET[:3], required=False)
    return p


def parse_args(argv):
    """(proof args, the dflash-train flags to hand on, their TrainConfig). A bad trainer flag is refused here,
    before anything runs."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.tiny:
        for k, v in dict(num_eval=min(args.num_eval, 4), num_other_styles=min(args.num_other_styles or 4, 4),
                         eval_max_new_tokens=min(args.eval_max_new_tokens, 24),
                         regen_max_new_tokens=24, regen_batch_size=32, regen_rows_per_shard=64,
                         # greedy answers of the random tiny target are a deterministic function to learn
                         temperature=0.0).items():
            setattr(args, k, v)
        if getattr(args, "target_model", None) is None:
            args.target_model = os.path.join(os.path.abspath(args.out), "tiny_target")  # setup_tiny() makes it
    elif not (getattr(args, "target_model", None) and args.prompts):
        p.error("--target-model and --prompts are required without --tiny")
    train_argv = (TINY_TRAIN_ARGV if args.tiny else []) + cli.given_train_argv(args, skip=DRIVER_SET)
    try:
        check_regeneration(args, prefix="regen-")
    except ValueError as e:
        p.error(str(e))
    if args.eval_workers < 1:
        p.error("--eval-workers must be at least 1")
    if args.synthesize_prompts < 0:
        p.error("--synthesize-prompts must be 0 (none) or more")
    if args.synthesize_temperature <= 0:
        p.error(f"--synthesize-temperature {args.synthesize_temperature:g}: pass a temperature above 0 (greedy "
                "sampling writes one prompt over and over)")
    if args.synthesize_system_prompts:  # read now: a bad file would otherwise fail after the regeneration
        try:
            read_system_prompts(args.synthesize_system_prompts)
        except (OSError, ValueError) as e:
            p.error(f"--synthesize-system-prompts: {' '.join(str(e).split())}")
    if args.extra_prompts:  # read now: a bad file would otherwise fail after the regeneration
        try:
            if not load_prompts(args.extra_prompts, what="--extra-prompts"):
                raise ValueError(f"--extra-prompts {args.extra_prompts}: it holds no prompt; pass a JSONL of prompts")
        except (OSError, ValueError) as e:
            p.error(" ".join(str(e).split()))
    if args.num_other_styles is not None and args.num_other_styles < 1:
        p.error("--num-other-styles must be at least 1 (leave it out for all)")
    try:
        n_other = len(load_prompts(args.other_styles))
    except ValueError as e:
        p.error(f"--other-styles: {e}")
    args.num_other_styles = min(args.num_other_styles or n_other, n_other)
    cfg = train_config(args, train_argv, data_dir="-")
    if cfg.time_budget_min is None:
        p.error("--time-budget-min is required: the proof trains for a wall-clock budget")
    args.regen_devices = [d.strip() for d in args.regen_devices.split(",") if d.strip()] if args.regen_devices \
        else None
    for d in (args.regen_devices or []) + [args.eval_device] * bool(args.eval_device):
        problem = device_problem(d)
        if problem:
            p.error(f"device {d!r}: {problem}")
    return args, train_argv, cfg


def train_config(args, train_argv: list[str], data_dir: str, mask_token_id: int | None = None):
    """The dflash-train config of this proof (cli.config_from_args: the flags' checks, one-line errors)."""
    argv = ["--target-model", args.target_model, "--data-dir", data_dir,
            "--output-dir", os.path.join(os.path.abspath(args.out), "train"), *train_argv]
    mask = mask_token_id if mask_token_id is not None else getattr(args, "mask_token_id", None)
    if mask is not None:
        argv += ["--mask-token-id", str(mask)]
    try:
        return cli.config_from_args(argv)
    except ValueError as e:  # dflash-train's own one-line refusal
        print(f"proof_smollm2.py: error: {' '.join(str(e).split())}", file=sys.stderr)
        raise SystemExit(2) from None


def cpu_threads(args, device: torch.device) -> tuple[int | None, dict | None]:
    """The evaluation worker's torch threads (--eval-threads, else None: torch's default) and dflash-train's
    environment (None: this one's). Both on the CPU at once, each gets its share of the cores."""
    if not (args.eval_device and torch.device(args.eval_device).type == "cpu" and device.type == "cpu"):
        return args.eval_threads, None
    eval_threads = args.eval_threads or cpu_share(2)
    train_threads = max(1, torch.get_num_threads() - eval_threads)
    log(f"the CPU shared: {train_threads} torch thread(s) for training, {eval_threads} for evaluation")
    return eval_threads, dict(os.environ, OMP_NUM_THREADS=str(train_threads))


def start_eval_worker(out: str, device: str, deadline_s: float | None, threads: int | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", proof_eval.__name__, "--out", out, "--device", device]
    if threads:
        cmd += ["--threads", str(threads)]
    if deadline_s is not None:
        cmd += ["--deadline-epoch", str(T0 + deadline_s)]
    log(f"evaluation worker on {device}: {' '.join(cmd)}")
    # The worker runs as `-m proofs.proof_eval`: the child's PYTHONPATH names the folder that holds this package, which
    # this process may have found through its working directory or pytest's pythonpath rather than PYTHONPATH.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(proof_eval.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env)  # its lines go to this process's stdout


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
    args, train_argv, cfg = parse_args(argv)
    try:
        return run(args, train_argv, cfg)
    except ValueError as e:  # bad input found before the step that needs it changed anything
        print(f"proof_smollm2.py: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


def run(args, train_argv: list[str], cfg) -> int:
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    device = torch.device(cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.tiny and args.prompts is None:
        args.target_model, args.prompts = setup_tiny(out, 160)
    stage = {}
    t = time.time()
    data_root = os.path.abspath(args.data_root or out)
    os.makedirs(data_root, exist_ok=True)
    mask_id, mask_src = mask_token_for(args.target_model, cfg.mask_token_id)
    cfg = dataclasses.replace(cfg, mask_token_id=mask_id)
    if cfg.init_drafter or cfg.init_layers_from_target:  # refused (by dflash-train's own check) before any write
        from dflash_trainer.loop.starting_weights import check_starting_weights
        from dflash_trainer.loop.train import drafter_config_for
        check_starting_weights(cfg, drafter_config_for(cfg)[2])  # headers only: dflash-train reads the weights
    shared = data_root != out
    train_prompts, eval_prompts, n_train = split_prompts(args.prompts, data_root, args.num_eval, cfg.seed, shared)
    log(f"{n_train} training prompts, {args.num_eval} held out; mask token {mask_id} from {mask_src}")
    regen_devices = args.regen_devices or [str(device)]
    data_dir, stats = regenerate(args, cfg, train_prompts, data_root, regen_devices, shared)
    if args.synthesize_prompts:
        data_dir, stats = add_synthesized(args, cfg, data_root, data_dir, stats, eval_prompts, regen_devices[0], shared)
    if args.extra_prompts:
        data_dir, stats = add_extra(args, cfg, data_root, data_dir, stats, eval_prompts, regen_devices[0], shared)
    stage["regenerate_s"] = round(time.time() - t, 1)
    log(f"data: {json.dumps(stats)}")
    if device.type == "cuda" and torch.cuda.is_initialized():  # only if this process generated (no new context)
        torch.cuda.empty_cache()
    # snapshots are measured from a fresh start, and no result of an earlier run may be merged into this one
    for stale in ("train", "eval"):
        shutil.rmtree(os.path.join(out, stale), ignore_errors=True)
    os.makedirs(os.path.join(out, "train"))
    cfg = train_config(args, train_argv, data_dir, mask_id)
    proof_eval.write_settings(out, {"target": cfg.target_model, "eval_prompts": eval_prompts,
                                    "other_styles": os.path.abspath(args.other_styles),
                                    "num_other_styles": args.num_other_styles, "block_size": cfg.block_size,
                                    "max_new_tokens": args.eval_max_new_tokens, "workers": args.eval_workers,
                                    "replay": args.eval_replay,
                                    "baseline_cache": os.path.join(data_root, "baseline-cache")})
    command = [sys.executable, "-m", "dflash_trainer.cli", "--target-model", cfg.target_model, "--data-dir", data_dir,
               "--output-dir", cfg.output_dir, "--mask-token-id", str(mask_id), *train_argv]
    results = {"target": cfg.target_model, "block_size": cfg.block_size, "layers": cfg.num_draft_layers,
               "mask_token": f"{mask_id} ({mask_src})", "num_eval_prompts": args.num_eval,
               "other_styles": os.path.abspath(args.other_styles), "num_other_styles_prompts": args.num_other_styles,
               "eval_max_new_tokens": args.eval_max_new_tokens, "eval_dtype": "float32", "device": str(device),
               "init_drafter": cfg.init_drafter, "eval_device": args.eval_device or str(device), "data": stats,
               "snapshots": [], "stage_s": stage, "args": vars(args), "train_command": command,
               "train_config": cfg.to_dict()}
    eval_threads, train_env = cpu_threads(args, device)
    worker = start_eval_worker(out, args.eval_device, args.deadline_s, eval_threads) if args.eval_device else None

    t = time.time()
    log(f"training: {' '.join(command)}")
    # its log lines go to this process's stdout
    trainer = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=train_env)
    while not exited(trainer, 2.0):  # the report follows the snapshots and the worker's evaluations
        refresh(out, results)
    stage["train_s"] = round(time.time() - t, 1)
    proof_eval.mark_training_done(out)
    refresh(out, results)  # the training record survives even if evaluation runs out of time
    if trainer.returncode != 0:
        log(f"dflash-train exited with {trainer.returncode} (its log is above); evaluating what it saved")
    t = time.time()
    if worker is not None:
        finish_eval_worker(worker, args.deadline_s)
    if results["snapshots"]:
        proof_eval.run_inline(out, device, None if args.deadline_s is None else T0 + args.deadline_s, log)
    stage["eval_after_training_s"] = round(time.time() - t, 1)
    refresh(out, results)
    for snap in results["snapshots"]:
        for name in proof_eval.SETS:
            snap.setdefault(proof_eval.result_key("eval", name), None)
    stage["total_s"] = round(time.time() - T0, 1)
    proof_report.write_results(out, results)
    log(f"results: {os.path.join(out, 'proof.md')}")
    print(open(os.path.join(out, "proof.md")).read())
    return 0 if trainer.returncode == 0 and results["snapshots"] else 1


def exited(proc: subprocess.Popen, timeout: float) -> bool:
    """Waits up to `timeout` s for `proc`: True once it has exited (at once, not at the end of a sleep)."""
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def refresh(out: str, results: dict) -> None:
    """dflash-train's snapshots and training curve (its snapshots.jsonl and metrics.jsonl) and the evaluations so
    far, into the report."""
    results["snapshots"] = proof_eval.listed_snapshots(out)
    results["curve"] = [{"step": r["step"], "s": round(r["train_s"], 1), "sequences": r["sequences"],
                         "loss": round(r["loss"], 4), "acc1": r["slot_acc"][1], "tau_proxy": round(r["tau_proxy"], 3),
                         "lr": r["lr"]} for r in proof_eval.read_jsonl(os.path.join(out, "train", "metrics.jsonl"))]
    proof_eval.merge(out, results)
    proof_report.write_results(out, results)


if __name__ == "__main__":
    sys.exit(main())
