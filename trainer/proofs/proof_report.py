"""The SmolLM2 proof's report: proof.json (everything) and proof.md (the τ table with both held-out sets side by
side, histograms, per-slot acceptance), written into --out and, if given, --report-dir. Rewritten after every
snapshot and evaluation."""

from __future__ import annotations

import json
import os

from dflash_trainer.eval.evaluate import format_styles
from dflash_trainer.telemetry.heartbeat import write_json_atomic

from .eval_sets import SET_LABELS, SETS, result_key


def write_results(out: str, results: dict) -> None:
    report_dir = results["args"].get("report_dir")
    for d in [out] + ([report_dir] if report_dir else []):
        _write_results(d, results)


def _tau(m: dict | None) -> str:
    return "-" if not m else f"{m['tau']:.2f}"


def _lossless(ms: list[dict | None]) -> str:
    ms = [m for m in ms if m]
    if ms and any(m.get("replayed") for m in ms):
        return "replayed"  # the proof's --eval-replay: τ by replaying the references, losslessness not checked
    return "-" if not ms else "yes" if all(m["lossless"] for m in ms) else "NO"


def _write_results(out: str, results: dict) -> None:
    os.makedirs(out, exist_ok=True)
    write_json_atomic(os.path.join(out, "proof.json"), results, indent=2)  # `watch` copies it while the proof runs
    bases = {name: results.get(result_key("baseline", name)) for name in SETS}
    base = bases["split"] or {}
    lines = [f"# DFlash proof: {results['target']}", "",
             f"block {results['block_size']}, {results['layers']} draft layers, mask token {results['mask_token']}, "
             f"{results['num_eval_prompts']} held-out prompts of the proof's split and "
             f"{results.get('num_other_styles_prompts', '-')} of other styles, <= {results['eval_max_new_tokens']} "
             f"new tokens, greedy, target {results['eval_dtype']} on {results.get('eval_device', results['device'])}; "
             f"trained by dflash-train on {results['device']}", "",
             "| drafter | training min | steps | passes | τ | τ other styles | τ / prompt-lookup | tokens/target fwd "
             "| lossless | train τ proxy |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    if base:
        lines.append(f"| prompt lookup (n<=3) | - | - | - | {_tau(base)} | {_tau(bases['other_styles'])} | 1.00 | "
                     f"{base['tokens_per_target_forward']:.2f} | {_lossless(list(bases.values()))} | - |")
    for s in results["snapshots"]:
        m = s.get("eval")
        if not m:
            continue
        ratio = m["tau"] / base["tau"] if base else float("nan")
        other = s.get(result_key("eval", "other_styles"))
        lines.append(f"| DFlash | {s['minutes']} | {s['step']} | {s.get('passes', '-')} | {_tau(m)} | {_tau(other)} | "
                     f"{ratio:.2f} | {m['tokens_per_target_forward']:.2f} | {_lossless([m, other])} | "
                     f"{'-' if s.get('tau_proxy') is None else format(s['tau_proxy'], '.2f')} |")
    lines += ["", "(τ / prompt-lookup, tokens/target fwd: on the proof's split; lossless: on both sets)"]
    if results.get("baseline_reused"):
        lines += ["", f"baseline (references, target only, prompt lookup) reused from an earlier proof on this data "
                      f"root (baseline-cache/{results['baseline_reused']}.json): its tok/s are that proof's"]
    for s in results["snapshots"]:
        for name in SETS:
            m = s.get(result_key("eval", name))
            if m:
                hist = ", ".join(f"{k}: {v}" for k, v in m["accept_length_histogram"].items() if v)
                lines += ["", f"accept-length histogram after {s['minutes']} min, {SET_LABELS[name]}: {hist}",
                          f"per-slot acceptance: {' '.join(f'{x:.2f}' for x in m['slot_accept_rate'])}"]
                if m.get("tau_by_style"):
                    lines.append(f"τ by style: {format_styles(m['tau_by_style'])}")
    for name, b in bases.items():
        if b:
            hist = ", ".join(f"{k}: {v}" for k, v in b["accept_length_histogram"].items() if v)
            lines += ["", f"prompt-lookup histogram, {SET_LABELS[name]}: {hist}"]
            if b.get("tau_by_style"):
                lines.append(f"prompt lookup τ by style: {format_styles(b['tau_by_style'])}")
    lines += ["", f"data: {json.dumps(results.get('data', {}))}", f"stages: {json.dumps(results['stage_s'])}"]
    with open(os.path.join(out, "proof.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
