"""The evaluation side of the SmolLM2 proof: the baseline and each training snapshot, one result file each.

`proof_smollm2.py` uses it in one of two ways:
  - inline, after training, on the training device (one GPU): the longest-trained snapshot first, then the
    shorter ones while the deadline allows;
  - as a worker process on a second device while the drafter trains (`--eval-device cuda:1`):
        python -m proofs.proof_eval --out OUT --device cuda:1
    it evaluates the baseline, then each snapshot as soon as train/snapshots.jsonl names it (dflash-train appends
    a line there for each snapshot it keeps), and stops once train/done (written by the driver when dflash-train
    has exited) exists and every named snapshot has a result. Anything the worker left undone (it crashed, or
    ran out of time) is then done inline, so a failed worker costs time, not results.

Every evaluation covers two prompt sets (SETS): the proof's own held-out split, and the other-styles set
(dflash_trainer/prep/other_styles.jsonl unless --other-styles names another file), prompts unlike anything the
proof trains on.

Files under OUT: eval/settings.json (written by the driver), eval/baseline.json (per set: greedy references,
target-only and prompt-lookup figures; taken from the data root's baseline-cache/ when a proof with the same
target, prompts, settings and device kind decoded it: baseline_cache.py), eval/snapshot-STEP.json (per set that
snapshot's DFlash figures, and its export dir).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from dflash_trainer.eval.prompt_progress import PromptProgress
from dflash_trainer.eval.evaluate import (eos_ids, evaluate, format_table, load_drafter, load_prompts, load_target,
                                          prompt_styles)
from dflash_trainer.eval.spec_decode import PROMPT_LOOKUP_NGRAM
from dflash_trainer.eval.workers import DecodePool
from dflash_trainer.export.exporter import export_checkpoint
from dflash_trainer.telemetry.heartbeat import write_json_atomic  # a reader (the driver) never sees half a file
from dflash_trainer.telemetry.writers import read_jsonl  # the snapshots.jsonl dflash-train appends to

from . import baseline_cache
from .eval_sets import SETS, result_key

SNAPSHOTS = os.path.join("train", "snapshots.jsonl")
DONE = os.path.join("train", "done")


def _path(out: str, name: str) -> str:
    return os.path.join(out, "eval", name)


def _read_json(path: str):
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_settings(out: str, settings: dict) -> None:
    os.makedirs(os.path.join(out, "eval"), exist_ok=True)
    write_json_atomic(_path(out, "settings.json"), settings)


def mark_training_done(out: str) -> None:
    open(os.path.join(out, DONE), "w").close()


def listed_snapshots(out: str) -> list[dict]:
    """The snapshots dflash-train has kept so far (its run dir's snapshots.jsonl: minutes, step, checkpoint...)."""
    return read_jsonl(os.path.join(out, SNAPSHOTS))


def snapshot_result(out: str, step: int) -> dict | None:
    return _read_json(_path(out, f"snapshot-{step}.json"))


def baseline_result(out: str) -> dict | None:
    return _read_json(_path(out, "baseline.json"))


def merge(out: str, results: dict) -> None:
    """Copy the evaluation files' figures into the driver's results dict (the report's shape, result_key)."""
    base = baseline_result(out)
    if base:
        for name, b in base["sets"].items():
            results[result_key("target_only", name)] = b["target_only"]
            results[result_key("baseline", name)] = b["prompt_lookup"]
        if base.get("reused"):
            results["baseline_reused"] = base["reused"]
    for snap in results["snapshots"]:
        res = snapshot_result(out, snap["step"])
        if res:
            snap["export"], snap["eval_device"] = res["export"], res["device"]
            for name, figures in res["eval"].items():
                snap[result_key("eval", name)] = figures


class Evaluator:
    """The target in float32 on one device, the prompts of each set, and their greedy references; with
    settings' "workers" > 1 (the proof's --eval-workers) the decoding runs in that many processes on the device
    (dflash_trainer.eval.workers: the same figures, sooner). close() ends them."""

    def __init__(self, out: str, device: torch.device, log):
        self.out, self.device, self.log = out, device, log
        self.settings = _read_json(_path(out, "settings.json"))
        s = self.settings
        workers = s.get("workers", 1)
        self.pool = DecodePool(s["target"], device, torch.float32, workers) if workers > 1 else None
        if self.pool is not None:
            log(f"decoding in {workers} worker processes on {device}")
        self.model, tokenizer = load_target(s["target"], device, torch.float32)
        self.eos = eos_ids(s["target"], self.model, tokenizer)
        self.prompts = {name: load_prompts(s[path_key], tokenizer, s.get(count_key) if count_key else None)
                        for name, (path_key, count_key) in SETS.items()}
        self.styles = {name: prompt_styles(s[path_key], s.get(count_key) if count_key else None)
                       for name, (path_key, count_key) in SETS.items()}
        base = baseline_result(out)
        self.references = {name: b["references"] for name, b in base["sets"].items()} if base else None

    def _evaluate(self, name: str, **kw) -> dict:
        s = self.settings
        return evaluate(self.model, self.prompts[name], block_size=s["block_size"],
                        max_new_tokens=s["max_new_tokens"], eos=self.eos, progress=PromptProgress(self.log),
                        pool=self.pool, styles=self.styles[name], **kw)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def baseline(self) -> None:
        if self.references is not None:
            return
        # --eval-replay: prompt lookup replayed over the references too (no target forward: its τ is the decode's,
        # since its drafts come from the context alone; 77.5 s of run 17's 204.6 s baseline decoded it)
        replayed = bool(self.settings.get("replay"))
        cache_dir = self.settings.get("baseline_cache")
        if cache_dir:  # baseline_cache.py: another proof on this data root may have decoded it already
            s = self.settings
            key, about = baseline_cache.baseline_key(s["target"], self.prompts, s["block_size"], s["max_new_tokens"],
                                                     PROMPT_LOOKUP_NGRAM, "float32", self.device)
            cached = baseline_cache.load(cache_dir, key)
            if cached is not None and not replayed and baseline_cache.lookup_replayed(cached):
                self.log("the cached baseline's prompt lookup was replayed, and this proof decodes: decoding it")
                cached = None
            if cached is not None:
                self.log(f"baseline reused from {os.path.join(cache_dir, key)}.json (the same target, prompts, "
                         f"settings and device kind {about['device']}): nothing decoded")
                self._keep_baseline({**cached, "device": str(self.device), "reused": key})
                return
        sets = {}
        for name in SETS:
            rep = self._evaluate(name, ngram=PROMPT_LOOKUP_NGRAM, baseline=True, references=None, replayed=replayed)
            sets[name] = {"references": rep["references"], "target_only": rep["target_only"],
                          "prompt_lookup": rep["methods"][f"prompt_lookup_n{PROMPT_LOOKUP_NGRAM}"]}
            self.log(f"baseline, {name}:\n" + format_table(rep))
        baseline = {"sets": sets, "device": str(self.device)}
        if cache_dir:
            self.log(f"baseline kept for later proofs: {baseline_cache.store(cache_dir, key, about, baseline)}")
        self._keep_baseline(baseline)

    def _keep_baseline(self, baseline: dict) -> None:
        self.references = {name: b["references"] for name, b in baseline["sets"].items()}
        write_json_atomic(_path(self.out, "baseline.json"), baseline)

    def snapshot(self, snap: dict) -> None:
        export_dir = os.path.join(self.out, f"export-{snap['minutes']}min")
        export_checkpoint(snap["checkpoint"], self.settings["target"], export_dir, dtype="bfloat16")
        replayed = bool(self.settings.get("replay"))  # the proof's --eval-replay: in this process, no decode
        # reloaded from the export (by each worker process, with a pool)
        local = self.pool is None or replayed
        drafter = load_drafter(export_dir, self.model, self.device, torch.float32) if local else None
        figures = {}
        for name in SETS:
            rep = self._evaluate(name, drafter=drafter, drafter_path=export_dir, baseline=False,
                                 references=self.references[name], replayed=replayed)
            figures[name] = rep["methods"]["dflash"]
            self.log(f"after {snap['minutes']} min ({snap['step']} steps), {name}:\n" + format_table(rep))
        write_json_atomic(_path(self.out, f"snapshot-{snap['step']}.json"),
                          {"eval": figures, "export": export_dir, "device": str(self.device)})


def run_inline(out: str, device: torch.device, deadline_t: float | None, log) -> None:
    """After training: whatever has no result yet, on the baseline's device if there is one (else on
    `device`): the baseline, the longest-trained snapshot (always evaluated), then the shorter ones while
    time.time() < deadline_t."""
    pending = [s for s in reversed(listed_snapshots(out)) if snapshot_result(out, s["step"]) is None]
    base = baseline_result(out)
    if not pending and base:
        return
    if base:  # the references were decoded there: the exact-match check needs the same device's numerics
        device = torch.device(base["device"])
    ev = Evaluator(out, device, log)
    try:
        ev.baseline()
        for i, snap in enumerate(pending):
            if i > 0 and deadline_t is not None and time.time() > deadline_t:
                log(f"deadline: {snap['minutes']} min snapshot not evaluated")
                continue
            ev.snapshot(snap)
    finally:
        ev.close()


def run_worker(out: str, device: torch.device, deadline_t: float | None, log, poll_s: float = 0.5) -> None:
    """Alongside training: the baseline, then each snapshot as it is listed, until training is done. A look at the
    list every `poll_s` (a file read): the driver waits on this worker once training is over."""
    ev = Evaluator(out, device, log)
    try:
        ev.baseline()
        while True:
            done = os.path.isfile(os.path.join(out, DONE))  # read before the list: no snapshot can be missed
            pending = [s for s in listed_snapshots(out) if snapshot_result(out, s["step"]) is None]
            if deadline_t is not None and time.time() > deadline_t:
                log(f"deadline: {len(pending)} snapshot(s) left to the driver")
                return
            if pending:  # once training is over, the longest-trained first: a deadline then cuts the shortest
                ev.snapshot(pending[-1] if done else pending[0])
            elif done:
                return
            else:
                time.sleep(poll_s)
    finally:
        ev.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the proof's --out (holds eval/settings.json)")
    p.add_argument("--device", required=True, help="e.g. cuda:1")
    p.add_argument("--deadline-epoch", type=float, default=None, help="stop after this time.time()")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (an evaluation on the CPU)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[eval {time.time() - t0:7.1f} s] {msg}", flush=True)

    run_worker(os.path.abspath(args.out), torch.device(args.device), args.deadline_epoch, log)
    log("worker done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
