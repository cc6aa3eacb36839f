"""Helpers of the trainer tests: tiny dflash-train command lines, process start, heartbeat and metrics reads.

(A module of its own, not conftest.py: several test folders are collected together, and `from conftest
import` would pick whichever conftest was imported first.)"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import subprocess
import sys
import time

from dflash_trainer.telemetry.writers import read_jsonl

def load_benchmark(name):
    """A module of the packages `benchmarks` (trainer/benchmarks) or `proofs` (trainer/proofs), e.g.
    "benchmarks.train_step", imported afresh as a run would: its module-level state (the proof's start time, settings
    read from the environment) is new. (pytest's `pythonpath` puts trainer/ on sys.path, as `python -m` run from
    trainer/ does.)"""
    return importlib.reload(importlib.import_module(name))


def run_proof_logged(argv, log_path):
    """The proof driver's main(argv) once, its output and its subprocesses' (dflash-train, the evaluation worker)
    written to log_path: (exit status, the log's text). For a module-scoped fixture whose proof several tests read:
    capfd sees only a test's own output."""
    driver = load_benchmark("proofs.proof_smollm2")
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "w", buffering=1) as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
        try:
            rc = driver.main(argv)
        finally:
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
    with open(log_path) as f:
        return rc, f.read()


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
    return read_jsonl(os.path.join(run_dir, "metrics.jsonl"))


def torchrun_cmd(tiny, out_dir, nproc, target_ranks, *extra):
    """train_cmd's job under `torchrun --standalone` on the CPU: ranks 0..target_ranks-1 run the target."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "dflash_trainer.cli", *train_cmd(tiny, out_dir, "--target-ranks", str(target_ranks), *extra)[3:]]


def alive(pid):
    """Running (a zombie waiting for its reaper is dead)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\tZ" not in next(line for line in f if line.startswith("State:"))
    except (OSError, StopIteration):
        return False


def rank_pids(run_dir, count):
    """The pids of a torchrun job's ranks 0..count-1 (<run-dir>/ranks/<rank>.pid), once all are written."""
    paths = [os.path.join(run_dir, "ranks", f"{r}.pid") for r in range(count)]
    wait_for(lambda: all(os.path.exists(p) for p in paths), timeout=60)
    return [int(open(p).read()) for p in paths]


@contextlib.contextmanager
def small_tmpfs(mount_point, size="32m"):
    """A real tmpfs of `size` at `mount_point` (needs root), unmounted after."""
    os.makedirs(mount_point, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def fill(disk, leave_bytes):
    """Fills `disk` with one file until ENOSPC, then shrinks it so that about `leave_bytes` stay free."""
    filler = disk / "filler"
    chunk = b"\0" * (64 << 10)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while True:
            os.write(fd, chunk)  # unbuffered: what returns is on the disk
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    os.truncate(filler, max(0, os.path.getsize(filler) - leave_bytes))
    return filler


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path))
