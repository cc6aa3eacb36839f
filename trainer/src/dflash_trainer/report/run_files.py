"""What a run directory holds for its report: the JSONL files the trainer writes there (metrics, profile,
telemetry, events, snapshots) and, for a proof's training run (<proof out>/train), the proof's proof.json beside it.
Stdlib only: reading never needs matplotlib."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

FILES = ("metrics", "profile", "telemetry", "events", "snapshots")


def read_rows(path: str) -> list[dict]:
    """The whole rows of a JSONL file ([] when absent); a torn last line (a run still writing) is skipped."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return rows


@dataclass
class RunFiles:
    run_dir: str
    metrics: list = field(default_factory=list)
    profile: list = field(default_factory=list)
    telemetry: list = field(default_factory=list)
    events: list = field(default_factory=list)
    snapshots: list = field(default_factory=list)
    proof: dict | None = None

    @classmethod
    def read(cls, run_dir: str) -> "RunFiles":
        if not os.path.isdir(run_dir):
            raise ValueError(f"{run_dir} is not a directory; pass a run directory (the one holding metrics.jsonl)")
        got = cls(run_dir, **{name: read_rows(os.path.join(run_dir, f"{name}.jsonl")) for name in FILES})
        if not got.metrics:
            raise ValueError(f"{run_dir} has no metrics.jsonl rows yet; pass the run directory of a run that has "
                             "logged a step (its --run-dir, by default its --output-dir)")
        got.proof = proof_json(run_dir)
        return got

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.run_dir))


def proof_json(run_dir: str) -> dict | None:
    """proof.json of the proof whose training run this is (the run dir or its parent holds it), else None."""
    for where in (run_dir, os.path.dirname(os.path.normpath(run_dir))):
        path = os.path.join(where, "proof.json")
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    return json.load(f)
            except ValueError:
                return None
    return None
