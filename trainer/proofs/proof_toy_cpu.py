"""A CPU-sized proof that the drafter drafts: a toy target that has learned something, then the real proof path.

The tiny random target of dflash-make-tiny produces noise, so no drafter (and no n-gram lookup) can
predict it. Here the tiny Qwen3 target is first trained for a few hundred steps on the synthetic chats of
tiny_tokenizer.py (count from a to b, repeat three words three times, list a category), so its greedy
answers follow rules; then proof_smollm2.py runs unchanged on it: regenerate (greedy), dflash-train with a
time budget and snapshots, export, reload, τ vs prompt lookup, losslessness.

    python -m proofs.proof_toy_cpu --out /tmp/proof-toy          # ~5 min on 2 CPU cores
Other flags go to proof_smollm2.py after the toy's own (so they win), e.g. --time-budget-min 4.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from dflash_trainer import cli
from dflash_trainer.data.batches import TokenizedDataset, collate
from dflash_trainer.prep.make_tiny import write_target
from dflash_trainer.prep.prepare_data import prepare
from dflash_trainer.prep.tiny_tokenizer import save_tokenizer, synthetic_chats

from . import proof_smollm2


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def train_target(target_dir: str, data_dir: str, steps: int, seed: int) -> float:
    """Teacher-forced next-token CE on the assistant tokens; returns the last loss."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    ds = TokenizedDataset(data_dir, 256)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(steps):
        batch = collate(ds, torch.randint(len(ds), (32,), generator=g).tolist())
        logits = model(input_ids=batch.input_ids).logits[:, :-1]
        labels = batch.input_ids[:, 1:]
        m = batch.loss_mask[:, 1:].float()
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                               reduction="none").view_as(m)
        loss = (ce * m).sum() / m.sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == steps - 1:
            print(f"target step {step} loss {loss.item():.4f}", flush=True)
    model.eval()
    model.save_pretrained(target_dir, safe_serialization=True)
    return float(loss)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--target-steps", type=int, default=400)
    cli.add_train_flags(p, only=("seed",))  # also seeds the toy target and its data
    args, rest = p.parse_known_args()  # the rest goes to proof_smollm2.py (and dflash-train), after the toy's flags
    args.seed = cli.train_settings(args, ("seed",))["seed"]
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    t0 = time.time()
    target = os.path.join(out, "toy_target")
    write_target(target, seed=args.seed)
    save_tokenizer(target)
    write_jsonl(os.path.join(out, "teacher.jsonl"), synthetic_chats(2000, seed=args.seed + 1))
    prepare(target, [os.path.join(out, "teacher.jsonl")], os.path.join(out, "teacher_data"), progress=False)
    loss = train_target(target, os.path.join(out, "teacher_data"), args.target_steps, args.seed)
    print(f"toy target trained: loss {loss:.4f} in {time.time() - t0:.0f} s", flush=True)
    prompts = [{"messages": r["messages"][:1]} for r in synthetic_chats(600, seed=args.seed + 2)]
    write_jsonl(os.path.join(out, "prompts.jsonl"), prompts)
    return proof_smollm2.main([
        "--target-model", target, "--prompts", os.path.join(out, "prompts.jsonl"), "--out", os.path.join(out, "proof"),
        "--time-budget-min", "2", "--snapshot-minutes", "0.5,1", "--num-eval", "24",
        "--eval-max-new-tokens", "48", "--regen-max-new-tokens", "48", "--regen-batch-size", "64",
        "--regen-rows-per-shard", "192", "--temperature", "0", "--block-size", "8", "--num-draft-layers", "2",
        "--gamma", "4", "--lr", "3e-3", "--grad-accum", "1", "--epochs", "1000", "--token-budget", "2048",
        "--max-batch-size", "32", "--max-seq-len", "256", "--max-anchors", "32", "--log-interval", "25",
        "--device", "cpu", "--seed", str(args.seed), *rest])


if __name__ == "__main__":
    sys.exit(main())
