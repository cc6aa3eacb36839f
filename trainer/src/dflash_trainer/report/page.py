"""The report's HTML page: one self-contained file (every chart a PNG inlined as base64, no script, no link out), so
it opens anywhere, offline, and travels as one file (training_status.yml -e report=true fetches it)."""

from __future__ import annotations

import base64
import html
import time

from dflash_trainer.report.charts import Charts
from dflash_trainer.report.run_files import RunFiles

STYLE = ("body{font-family:sans-serif;max-width:60em;margin:1em auto;color:#222}figure{margin:1em 0}"
         "img{max-width:100%}table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd;"
         "text-align:left}.none{color:#777;font-style:italic}")


def chart_list(run: RunFiles) -> list[tuple[str, str, bytes | None, str]]:
    """(id, caption, PNG or None, why none) of every chart, in page order."""
    c = Charts(run)
    charts = [
        ("loss", "training loss", c.series("training loss", "loss", "loss"), "no loss logged"),
        ("accuracy", "draft accuracy per block slot", c.accuracy(), "no accuracy logged"),
        ("tau-proxy", "τ proxy (expected accepted tokens from the slot accuracies)",
         c.series("τ proxy", "τ proxy", "tau_proxy"), "no τ proxy logged"),
        ("tokens-per-s", "training tokens/s", c.series("throughput", "tokens/s", "tokens_per_s"),
         "no throughput logged"),
        ("queue-depth", "hidden-state queue depth per drafter rank", c.queue_depth(),
         "no hidden-state queue: a one-process run (the queue is torchrun's)"),
        ("gpu-util", "GPU utilization", c.gpus("util_pct", "GPU utilization", "% busy"),
         "no GPU telemetry (a CPU run, or NVML unavailable)"),
        ("gpu-mem", "GPU memory", c.gpus("mem_used_mb", "GPU memory used", "MiB"), "no GPU telemetry"),
        ("gpu-power", "GPU power", c.gpus("power_w", "GPU power", "W"), "no GPU telemetry"),
    ]
    if run.proof is not None:
        charts += [("proof-tau", "proof: τ vs minutes of training", c.proof_tau(), "no snapshot evaluated yet"),
                   ("proof-histogram", "proof: acceptance histogram", c.proof_histogram(),
                    "no snapshot evaluated yet")]
    return charts


def summary_rows(run: RunFiles) -> list[tuple[str, str]]:
    last = run.metrics[-1]
    rows = [("run directory", run.run_dir), ("last step", str(last.get("step"))),
            ("loss", f"{last.get('loss', float('nan')):.4f}"), ("τ proxy", f"{last.get('tau_proxy', 0):.3f}"),
            ("training time", f"{last.get('train_s', 0):.1f} s" if last.get("train_s", 0) < 60 else
             f"{last['train_s'] / 60:.1f} min")]
    if last.get("total_steps"):
        rows.append(("progress", f"{last['step']}/{last['total_steps']} ({last.get('done_pct')}%)"))
    for e in run.events:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(e["time"]))
        rows.append((e.get("event", "event"), f"{when} at step {e.get('step')}: {e.get('reason')}"))
    return rows


def render(run: RunFiles) -> str:
    esc = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>dflash run {esc(run.name)}</title>"
             f"<style>{STYLE}</style></head><body><h1>dflash run {esc(run.name)}</h1><table id='summary'>"]
    parts += [f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in summary_rows(run)]
    parts.append("</table>")
    for chart_id, caption, png, why_none in chart_list(run):
        parts.append(f"<figure id='{chart_id}'><figcaption>{esc(caption)}</figcaption>")
        if png is None:
            parts.append(f"<p class='none'>{esc(why_none)}</p>")
        else:
            data = base64.b64encode(png).decode()
            parts.append(f"<img class='chart' alt='{esc(caption)}' src='data:image/png;base64,{data}'>")
        parts.append("</figure>")
    parts.append(f"<p class='none'>written by dflash-report at "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p></body></html>")
    return "".join(parts)
