"""A lever's τ against its reference's, prompt by prompt: two proofs' proof.json, evaluated on the same prompts.

For each held-out set (the proof's split, other styles) it prints both τ, their difference Δ and a 95 % interval of
Δ from a paired bootstrap over the prompts: the prompts are drawn again with replacement, both drafters scored on
the same draw (τ of a draw = its accepted tokens over its verification steps, as the evaluation's τ). The interval
says how much Δ owes to which prompts happened to be held out. It does not hold the training's own variation from
run to run (the same flags and data in two leases moved τ by −0.07 / +0.03 at 5 minutes, PROOF.md run 26, the
second "above zero" in 97 % of resamples): a Δ inside that is no lever's effect, whatever its interval. So
`--replicate` takes another proof of the reference's flags (repeat it for several): its Δ against the reference is
printed beside the lever's, and the last column says whether the lever's |Δ| is larger than every such Δ (a floor
from the reference's own spread over leases, not a test).

    python -m proofs.compare_proofs REFERENCE.json LEVER.json [--replicate REFERENCE_AGAIN.json] [--snapshot 5] \
        [--resamples 10000] [--seed 0]

A longer budget against a shorter one (what doubling the minutes gives) compares two snapshots of other minutes:
`--snapshot 10 --lever-snapshot 20` takes the reference's at 10 and the lever's at 20.

The two must share their prompts and references: the baseline's prompt lookup is deterministic, so its steps per
prompt, in both files, must be equal (else the proofs had another split, other prompts or another target).
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from .eval_sets import SET_LABELS, SETS, result_key


class Mismatch(ValueError):
    """The two proofs cannot be compared prompt by prompt (one line: what differs and what to do)."""


def common_minutes(ref_proof: dict, lever_proof: dict) -> float:
    """The last snapshot both proofs took (a 10-minute run is compared with a 5-minute one at 5 minutes)."""
    have = [[s["minutes"] for s in p.get("snapshots") or []] for p in (ref_proof, lever_proof)]
    common = sorted(set(have[0]) & set(have[1]))
    if not common:
        raise Mismatch(f"the two proofs share no snapshot (the reference's minutes: {have[0] or 'none'}, the lever's: "
                       f"{have[1] or 'none'}): compare proofs that reached the same one")
    return common[-1]


def snapshot_minutes(proof: dict) -> float:
    """The minutes of a proof's last snapshot (the reference's default when the lever's snapshot is named)."""
    snaps = proof.get("snapshots") or []
    if not snaps:
        raise Mismatch("the reference has no snapshot: compare proofs that evaluated one")
    return snaps[-1]["minutes"]


def snapshot(proof: dict, minutes: float, name: str, flag: str = "--snapshot") -> dict:
    snaps = proof.get("snapshots") or []
    for s in snaps:
        if abs(s["minutes"] - minutes) < 1e-9:
            return s
    have = ", ".join(f"{s['minutes']:g}" for s in snaps) or "none"
    raise Mismatch(f"{name} has no snapshot at {minutes:g} min (it has {have}): pass one of those to {flag}")


def tau(steps: list[int], accepted: list[int], draw: list[int]) -> float:
    return sum(accepted[i] for i in draw) / sum(steps[i] for i in draw)


def paired_interval(ref: dict, lever: dict, resamples: int, seed: int) -> tuple[float, float, float]:
    """(2.5 %, 97.5 % quantiles of Δ over the resampled prompt sets, share of them with Δ > 0)."""
    n = len(ref["prompt_steps"])
    rng = random.Random(seed)
    deltas = []
    for _ in range(resamples):
        draw = [rng.randrange(n) for _ in range(n)]
        deltas.append(tau(lever["prompt_steps"], lever["prompt_accepted"], draw)
                      - tau(ref["prompt_steps"], ref["prompt_accepted"], draw))
    deltas.sort()
    lo = deltas[int(0.025 * (resamples - 1))]
    hi = deltas[int(0.975 * (resamples - 1))]
    return lo, hi, sum(d > 0 for d in deltas) / resamples


def compare(ref_proof: dict, lever_proof: dict, minutes: float | None = None, resamples: int = 10000,
            seed: int = 0, lever_minutes: float | None = None) -> list[dict]:
    """One row per set both proofs evaluated, at `minutes` (default: the last snapshot both took); the lever's
    snapshot at `lever_minutes` where given (a longer budget against a shorter one)."""
    if minutes is None:
        minutes = common_minutes(ref_proof, lever_proof) if lever_minutes is None else snapshot_minutes(ref_proof)
    flag = "--snapshot" if lever_minutes is None else "--lever-snapshot"
    lever_minutes = minutes if lever_minutes is None else lever_minutes
    ref_snap = snapshot(ref_proof, minutes, "the reference")
    lever_snap = snapshot(lever_proof, lever_minutes, "the lever", flag)
    rows = []
    for name in SETS:
        ref, lever = ref_snap.get(result_key("eval", name)), lever_snap.get(result_key("eval", name))
        if not ref or not lever:
            continue
        ref_base = ref_proof.get(result_key("baseline", name)) or {}
        lever_base = lever_proof.get(result_key("baseline", name)) or {}
        for who, figures in (("the reference", (ref, ref_base)), ("the lever", (lever, lever_base))):
            if not all(m.get("prompt_steps") for m in figures):
                raise Mismatch(f"{SET_LABELS[name]}: {who} has no figures per prompt (prompt_steps; older proof.json "
                               f"files lack them): compare proofs that recorded them")
        if ref_base["prompt_steps"] != lever_base["prompt_steps"]:
            raise Mismatch(f"{SET_LABELS[name]}: prompt lookup's steps per prompt differ between the two proofs, so "
                           f"they were evaluated on other prompts or references: compare proofs of the same target, "
                           f"data and --seed")
        lo, hi, above = paired_interval(ref, lever, resamples, seed)
        rows.append({"set": name, "minutes": minutes, "lever_minutes": lever_minutes,
                     "prompts": len(ref["prompt_steps"]), "tau_reference": ref["tau"], "tau_lever": lever["tau"],
                     "delta": lever["tau"] - ref["tau"], "interval": [lo, hi],
                     "share_above_zero": above, "steps": [ref_snap["step"], lever_snap["step"]]})
    if not rows:
        raise Mismatch("no held-out set was evaluated in both proofs at that snapshot: compare proofs that "
                       "evaluated one")
    return rows


def against_replicate(rows: list[dict], ref_proof: dict, replicate_proofs: list[dict], resamples: int,
                      seed: int) -> list[dict]:
    """Each reference run again (the same flags and data) against the reference, at the reference's snapshot: under
    each row of `rows`, one row per replicate; each lever row gets `beyond_replicate`: its |Δ| above every
    replicate's (with several, the reference's own spread over leases)."""
    again = []
    for replicate_proof in replicate_proofs:
        by_set = {r["set"]: r for r in compare(ref_proof, replicate_proof, rows[0]["minutes"], resamples, seed)}
        missing = [SET_LABELS[r["set"]] for r in rows if r["set"] not in by_set]
        if missing:
            raise Mismatch(f"a replicate has no figures for {', '.join(missing)}: pass proofs of the reference's "
                           f"flags that evaluated the same sets")
        again.append(by_set)
    out = []
    for r in rows:
        spread = [a[r["set"]] for a in again]
        out.append(dict(r, beyond_replicate=all(abs(r["delta"]) > abs(a["delta"]) for a in spread)))
        out += [dict(a, replicate=True) for a in spread]
    return out


def format_rows(rows: list[dict]) -> str:
    at = rows[0]["minutes"], rows[0]["lever_minutes"]
    when = f"after {at[0]:g} min" if at[0] == at[1] else f"after {at[0]:g} / {at[1]:g} min"
    with_replicate = any(r.get("replicate") for r in rows)
    columns = [when, "prompts", "steps (reference / lever)", "τ reference", "τ lever", "Δ",
               "95 % interval of Δ (prompts resampled)", "resamples with Δ > 0"]
    columns += ["Δ beyond the reference again"] if with_replicate else []
    lines = [" | ".join(columns), "|".join(["---"] * len(columns))]
    for r in rows:
        lo, hi = r["interval"]
        label = SET_LABELS[r["set"]] + (", the reference again" if r.get("replicate") else "")
        line = (f"{label} | {r['prompts']} | {r['steps'][0]:,} / {r['steps'][1]:,} | "
                f"{r['tau_reference']:.2f} | {r['tau_lever']:.2f} | {r['delta']:+.2f} | "
                f"{lo:+.2f} … {hi:+.2f} | {r['share_above_zero']:.0%}")
        if with_replicate:
            line += " | " + ("-" if r.get("replicate") else "yes" if r["beyond_replicate"] else "no")
        lines.append(line)
    return "\n".join("| " + line + " |" for line in lines)


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reference", help="the reference proof's proof.json")
    p.add_argument("lever", help="the lever's proof.json (the same prompts)")
    p.add_argument("--snapshot", type=float, default=None, metavar="MINUTES",
                   help="the snapshot to compare, by its minutes of training (default: the last both took; with "
                        "--lever-snapshot, the reference's last)")
    p.add_argument("--lever-snapshot", type=float, default=None, metavar="MINUTES",
                   help="the lever's snapshot, where it differs from the reference's (e.g. a 20-minute budget's end "
                        "against a 10-minute budget's: --snapshot 10 --lever-snapshot 20)")
    p.add_argument("--replicate", action="append", default=[], metavar="PROOF_JSON",
                   help="another proof of the reference's flags and data (repeat it for several leases): its Δ "
                        "against the reference (the training's own spread) is printed under each row, and whether "
                        "the lever's |Δ| is above every such Δ")
    p.add_argument("--resamples", type=int, default=10000, help="bootstrap draws (default: 10000)")
    p.add_argument("--seed", type=int, default=0, help="the draws' seed (default: 0)")
    args = p.parse_args(argv)
    if args.resamples < 100:
        p.error(f"--resamples {args.resamples}: too few for a 95 % interval; give 100 or more")
    try:
        ref, lever = load(args.reference), load(args.lever)
        rows = compare(ref, lever, args.snapshot, args.resamples, args.seed, args.lever_snapshot)
        if args.replicate:
            rows = against_replicate(rows, ref, [load(path) for path in args.replicate], args.resamples, args.seed)
    except Mismatch as e:
        print(f"compare_proofs: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:  # a missing or unreadable proof.json (json's errors are ValueErrors)
        print(f"compare_proofs: cannot read a proof: {' '.join(str(e).split())}; pass the proof.json files the proofs "
              f"wrote", file=sys.stderr)
        return 2
    print(format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
