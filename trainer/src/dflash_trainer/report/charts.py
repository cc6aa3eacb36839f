"""The report's charts, each a PNG (bytes) drawn with matplotlib's Agg backend (no display): over wall-clock minutes
since the run's first metrics row, with every restart (events.jsonl) marked by a dashed line. A chart with nothing
to draw (no GPU on a CPU run, no queue in one process) is None, and the page says why instead."""

from __future__ import annotations

import io
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dflash_trainer.report.run_files import RunFiles  # noqa: E402

SIZE = (7.5, 3.2)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


class Charts:
    def __init__(self, run: RunFiles):
        self.run = run
        self.t0 = min(r["time"] for r in run.metrics if "time" in r)

    def minutes(self, rows: list[dict]) -> list[float]:
        return [(r["time"] - self.t0) / 60 for r in rows]

    def line(self, ax, rows: list[dict], values: list, **kw) -> None:
        """values over time, the line broken at each restart (no stroke across the time the run was down)."""
        restarts = sorted(e["time"] for e in self.run.events if e.get("event") == "restart")
        xs, ys = [], []
        for i, (row, value) in enumerate(zip(rows, values)):
            if i and any(rows[i - 1]["time"] < t <= row["time"] for t in restarts):
                xs.append(float("nan"))
                ys.append(float("nan"))
            xs.append((row["time"] - self.t0) / 60)
            ys.append(value)
        ax.plot(xs, ys, **kw)

    def _axes(self, title: str, ylabel: str):
        fig, ax = plt.subplots(figsize=SIZE)
        ax.set_title(title)
        ax.set_xlabel("minutes (wall clock)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        for i, e in enumerate(r for r in self.run.events if r.get("event") == "restart"):
            ax.axvline((e["time"] - self.t0) / 60, color="tab:red", linestyle="--", linewidth=1,
                       label="restart" if i == 0 else None)
        return fig, ax

    def series(self, title: str, ylabel: str, key) -> bytes | None:
        """One metrics field (or a function of the row) over time."""
        get = key if callable(key) else (lambda r: r.get(key))
        rows = [r for r in self.run.metrics if "time" in r and get(r) is not None]
        if not rows:
            return None
        fig, ax = self._axes(title, ylabel)
        self.line(ax, rows, [get(r) for r in rows], marker=".", label=ylabel)
        ax.legend(loc="best")
        return _png(fig)

    def accuracy(self) -> bytes | None:
        rows = [r for r in self.run.metrics if "time" in r and len(r.get("slot_acc") or []) > 1]
        if not rows:
            return None
        fig, ax = self._axes("draft accuracy per block slot", "accuracy")
        slots = len(rows[0]["slot_acc"])
        for s in sorted({s for s in (1, 2, slots // 2, slots - 1) if 0 < s < slots}):  # slot 0 is the anchor
            self.line(ax, rows, [r["slot_acc"][s] for r in rows], label=f"slot {s}")
        ax.legend(loc="best")
        return _png(fig)

    def queue_depth(self) -> bytes | None:
        """Hidden-state queue depth of each drafter rank (torchrun profile rows)."""
        by_rank = defaultdict(list)
        for r in self.run.profile:
            if r.get("queue_depth") is not None and "time" in r:
                by_rank[r.get("rank", 0)].append(r)
        if not by_rank:
            return None
        fig, ax = self._axes("hidden-state queue depth per drafter rank", "micro-batches queued")
        for rank, rows in sorted(by_rank.items()):
            self.line(ax, rows, [r["queue_depth"] for r in rows], label=f"rank {rank}")
        ax.legend(loc="best")
        return _png(fig)

    def gpus(self, key: str, title: str, ylabel: str) -> bytes | None:
        """One NVML field of every GPU (per reading rank) over time."""
        by_gpu = defaultdict(list)
        for r in self.run.telemetry:
            if r.get(key) is not None and "time" in r:
                by_gpu[(r.get("rank"), r["gpu"])].append(r)
        if not by_gpu:
            return None
        fig, ax = self._axes(title, ylabel)
        for (rank, gpu), rows in sorted(by_gpu.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
            label = f"GPU {gpu}" + (f" (rank {rank})" if rank is not None else "")
            self.line(ax, rows, [r[key] for r in rows], label=label)
        ax.legend(loc="best", fontsize="small")
        return _png(fig)

    def proof_tau(self) -> bytes | None:
        """The proof's measured τ of each snapshot over its training minutes, against the baseline drafter's."""
        proof = self.run.proof or {}
        points = [(s["minutes"], s["eval"]["tau"]) for s in proof.get("snapshots") or []
                  if (s.get("eval") or {}).get("tau") is not None]
        if not points:
            return None
        fig, ax = plt.subplots(figsize=SIZE)
        ax.set_title("proof: measured τ (accepted tokens per target forward) vs training minutes")
        ax.set_xlabel("minutes of training")
        ax.set_ylabel("τ")
        ax.grid(alpha=0.3)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label="trained drafter")
        base = (proof.get("baseline") or {}).get("tau")
        if base is not None:
            ax.axhline(base, color="tab:gray", linestyle=":", label="baseline")
        ax.axhline(1.0, color="black", linewidth=0.8, label="target only")
        ax.legend(loc="best")
        return _png(fig)

    def proof_histogram(self) -> bytes | None:
        """Acceptance lengths of the last evaluated snapshot (and the baseline's), as shares of decode steps."""
        proof = self.run.proof or {}
        last = [s for s in proof.get("snapshots") or [] if (s.get("eval") or {}).get("accept_length_histogram")]
        if not last:
            return None
        fig, ax = plt.subplots(figsize=SIZE)
        ax.set_title(f"proof: accepted tokens per step, snapshot {last[-1]['minutes']:g} min")
        ax.set_xlabel("tokens accepted in one target forward")
        ax.set_ylabel("share of steps")
        shown = [("trained", last[-1]["eval"]["accept_length_histogram"], 0.0)]
        if (proof.get("baseline") or {}).get("accept_length_histogram"):
            shown.append(("baseline", proof["baseline"]["accept_length_histogram"], 0.4))
        for label, hist, offset in shown:
            total = sum(hist.values()) or 1
            xs = sorted(int(k) for k in hist)
            ax.bar([x + offset for x in xs], [hist[str(x)] / total for x in xs], width=0.4, label=label)
        ax.legend(loc="best")
        return _png(fig)
