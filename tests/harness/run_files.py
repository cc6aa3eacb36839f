"""Reading a run directory's records in tests that drive the real trainer (the collection's side; the trainer's own
tests have trainer_testlib.read_metrics, since neither suite imports the other)."""
import json
import os


def read_metrics(run_dir):
    """The rows of <run_dir>/metrics.jsonl so far (one per logged optimizer step), [] before the first."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
