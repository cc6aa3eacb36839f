"""Slot-1 acceptance of a drafter at every anchor of the target's greedy decodes, by the target's own confidence in
the token it chose there (its top-1 probability): does the drafter miss where the target is unsure (near-ties that
no drafter calls reliably) or where the target is sure (what the drafter has not learned)? PROOF.md run 23.

    cd trainer && python -m proofs.slot1_confidence --target-model DIR --drafter EXPORT --prompts P.jsonl \
        --report EVAL.json [--device cpu]

EVAL.json is a dflash-eval report of those prompts: its `references` are the target's greedy decodes. The drafts
come from eval/replay.py's dflash_drafts (the drafter at every anchor at once; the target's probabilities from the
same target forward), so slot 1 at anchor r_j is accepted exactly when the replayed step anchored there accepts at
least one token (the last anchor, r_{N-2}, is counted too, though a decode has only r_{N-1} left to make there and
drafts nothing).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dflash_trainer.eval.evaluate import load_drafter, load_prompts, load_target
from dflash_trainer.eval.replay import dflash_drafts_and_target_logits

EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99)  # lower bounds of the confidence buckets; the last one ends at 1
# Of the anchors whose reference token is the target's top-1: below it, the inputs do not match. Run 23's export on
# SmolLM2, float32: 3,283 of 3,283 with the right prompts, 2,534 (77 %) with the other-styles prompts instead (the
# reference's own text in the context makes it likely by chance).
MIN_AGREEMENT = 0.98


@torch.no_grad()
def anchor_hits(model, drafter, prompt: list[int],
                reference: list[int]) -> tuple[list[float], list[bool], list[bool]]:
    """For every anchor r_j with a next reference token (j < N - 1): the target's top-1 probability at r_j (the
    prediction of r_{j+1}), whether the drafter's slot 1 drafted r_{j+1} there, and whether r_{j+1} is the target's
    own top-1 (true but for rounding when the reference is this prompt's greedy decode: the check of the inputs)."""
    n = len(reference)
    if n < 2:
        return [], [], []
    device = next(model.parameters()).device
    # drafts [N, B-1]: row j drafts r_{j+1}.. at anchor r_j; logits [P + N - 1, V]: position P + j predicts r_{j+1}
    drafts, logits = dflash_drafts_and_target_logits(model, drafter, prompt, reference)
    start = len(prompt)
    confidence, top1 = logits[start:start + n - 1].float().softmax(-1).max(-1)
    following = torch.tensor(reference[1:], device=device)
    return confidence.tolist(), (drafts[:n - 1, 0] == following).tolist(), (top1 == following).tolist()


def buckets(confidence: list[float], hits: list[bool], edges=EDGES) -> list[dict]:
    """One row per confidence bucket: its anchors, their share, slot 1's acceptance in it, its share of all misses."""
    total, misses = len(hits), hits.count(False)
    rows = []
    for i, low in enumerate(edges):
        high = edges[i + 1] if i + 1 < len(edges) else None
        inside = [h for c, h in zip(confidence, hits) if c >= low and (high is None or c < high)]
        rows.append({"from": low, "to": high if high is not None else 1.0, "anchors": len(inside),
                     "share": len(inside) / total if total else None,
                     "slot1": sum(inside) / len(inside) if inside else None,
                     "share_of_misses": inside.count(False) / misses if misses else None})
    return rows


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict], hits: list[bool], confidence: list[float]) -> str:
    head = (f"{len(hits)} anchors, slot-1 acceptance {sum(hits) / len(hits):.3f}, the target's mean top-1 "
            f"probability {sum(confidence) / len(confidence):.3f}\n")
    lines = ["| target's top-1 probability | anchors | share | slot-1 acceptance | share of the misses |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['from']:.2f} - {r['to']:.2f} | {r['anchors']} | {_cell(r['share'], '.1%')} | "
                     f"{_cell(r['slot1'], '.3f')} | {_cell(r['share_of_misses'], '.1%')} |")
    return head + "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target-model", required=True)
    p.add_argument("--drafter", required=True, help="export dir, checkpoints/step-N or training output dir")
    p.add_argument("--prompts", required=True, help="the prompts the report decoded (JSONL, as dflash-eval reads)")
    p.add_argument("--report", required=True, help="dflash-eval's report of those prompts (its references)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    with open(args.report) as f:
        references = json.load(f).get("references")
    if not references:
        sys.exit(f"slot1_confidence: {args.report} holds no `references`: give the dflash-eval report (--out) of "
                 "these --prompts")
    model, tokenizer = load_target(args.target_model, device, torch.float32)
    drafter = load_drafter(args.drafter, model, device, torch.float32)
    prompts = load_prompts(args.prompts, tokenizer, len(references))
    if len(prompts) != len(references):
        sys.exit(f"slot1_confidence: {args.prompts} has {len(prompts)} prompts, the report {len(references)} "
                 "references: give the prompts file the report decoded")
    confidence, hits, agrees = [], [], []
    for prompt, reference in zip(prompts, references):
        c, h, a = anchor_hits(model, drafter, prompt, reference)
        confidence += c
        hits += h
        agrees += a
    # the references of other prompts (a longer prompts file, another order) agree with the target's top-1 by chance
    if sum(agrees) < MIN_AGREEMENT * len(agrees):
        sys.exit(f"slot1_confidence: the report's references are the target's top-1 at only {sum(agrees)} of "
                 f"{len(agrees)} anchors: give the prompts file and target the report decoded, in its order")
    print(table(buckets(confidence, hits), hits, confidence))


if __name__ == "__main__":
    main()
