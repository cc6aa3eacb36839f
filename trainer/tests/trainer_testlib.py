"""Helpers of the trainer tests: tiny dflash-train command lines, process start, heartbeat and metrics reads.

(A module of its own, not conftest.py: several test folders are collected together, and `from conftest
import` would pick whichever conftest was imported first.)"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")


def load_benchmark(name):
    """A trainer/benchmarks script as a module (that folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_cmd(tiny, out_dir, *extra):
    """A fast dflash-train command line on the tiny fixtures (CPU)."""
    return [sys.executable, "-m", "dflash_trainer.cli", "--target-model", tiny["target"], "--data-dir", tiny["data"],
            "--output-dir", str(out_dir), "--target-gpus", "", "--drafter-gpus", "", "--block-size", "4",
            "--max-anchors", "16", "--num-draft-layers", "1", "--gamma", "4", "--token-budget", "1024",
            "--max-seq-len", "256", "--max-batch-size", "4", "--grad-accum", "1", "--log-interval", "1",
            "--heartbeat-interval", "0.2", "--lr", "3e-3", *extra]


def start(cmd, log_path, env=None):
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
    log = open(log_path, "ab")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)


def read_heartbeat(run_dir):
    try:
        with open(os.path.join(run_dir, "heartbeat.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def wait_for(predicate, timeout=90.0, interval=0.05, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            value = predicate()
            if value:
                return value
            raise AssertionError(f"process exited with {proc.returncode} before the condition held")
        time.sleep(interval)
    raise AssertionError("timed out waiting")


def read_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
