"""The SmolLM2 proof's report: proof.json (everything) and proof.md (the τ table, histograms, per-slot
acceptance), written into --out and, if given, --report-dir. Rewritten after every snapshot and evaluation."""

from __future__ import annotations

import json
import os

from dflash_trainer.telemetry.heartbeat import write_json_atomic


def write_results(out: str, results: dict) -> None:
    report_dir = results["args"].get("report_dir")
    for d in [out] + ([report_dir] if report_dir else []):
        _write_results(d, results)


def _write_results(out: str, results: dict) -> None:
    os.makedirs(out, exist_ok=True)
    write_json_atomic(os.path.join(out, "proof.json"), results, indent=2)  # `watch` copies it while the proof runs
    base = results.get("baseline") or {}
    lines = [f"# DFlash proof: {results['target']}", "",
             f"block {results['block_size']}, {results['layers']} draft layers, mask token {results['mask_token']}, "
             f"{results['num_eval_prompts']} held-out prompts, <= {results['eval_max_new_tokens']} new tokens, "
             f"greedy, target {results['eval_dtype']} on {results.get('eval_device', results['device'])}; "
             f"trained by dflash-train on {results['device']}", "",
             "| drafter | training min | steps | passes | τ | τ / prompt-lookup | tokens/target fwd | lossless "
             "| train τ proxy |",
             "|---|---|---|---|---|---|---|---|---|"]
    if base:
        lines.append(f"| prompt lookup (n<=3) | - | - | - | {base['tau']:.2f} | 1.00 | "
                     f"{base['tokens_per_target_forward']:.2f} | {'yes' if base['lossless'] else 'NO'} | - |")
    for s in results["snapshots"]:
        m = s.get("eval")
        if not m:
            continue
        ratio = m["tau"] / base["tau"] if base else float("nan")
        lines.append(f"| DFlash | {s['minutes']} | {s['step']} | {s.get('passes', '-')} | {m['tau']:.2f} | "
                     f"{ratio:.2f} | {m['tokens_per_target_forward']:.2f} | {'yes' if m['lossless'] else 'NO'} | "
                     f"{'-' if s.get('tau_proxy') is None else format(s['tau_proxy'], '.2f')} |")
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

