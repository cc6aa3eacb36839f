"""train.run's resources (the JSON-lines writers, the profiler, NVML telemetry and its thread, the W&B run) are
closed on every way out: here a step that raises (its micro-batch's loss computation fails), in process."""

import os
import threading

import pytest

from trainer_testlib import read_metrics, train_cmd
from dflash_trainer.loop import train
import dflash_trainer.telemetry.writers as telemetry
from dflash_trainer.loop.checkpoint import find_latest
from dflash_trainer.cli import config_from_args
from dflash_trainer.config import validate_paths
from dflash_trainer.telemetry.heartbeat import Heartbeat

RUN_FILES = ("metrics.jsonl", "snapshots.jsonl", "profile.jsonl", "telemetry.jsonl")


def open_run_files(run_dir):
    """The files of the run dir that this process holds open."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if path.startswith(str(run_dir)) and os.path.basename(path) in RUN_FILES:
            held.append(path)
    return held


@pytest.mark.timeout(300)
def test_a_step_that_raises_closes_every_resource(tiny, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import wandb
    out = tmp_path / "out"
    # W&B offline, nothing reachable (as test_telemetry runs it); the profile written at every step
    for key, value in {"WANDB_MODE": "offline", "WANDB_PROJECT": "dflash-test",
                       "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
                       "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "HTTPS_PROXY": "http://127.0.0.1:9",
                       "HTTP_PROXY": "http://127.0.0.1:9", "DFLASH_PROFILE_INTERVAL": "0"}.items():
        monkeypatch.setenv(key, value)
    real, calls = train.drafter_micro_batch, []

    def failing(*args, **kwargs):  # the loop's micro-batch step (train.run passes it in), failing on the third
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the loss of micro-batch 3 failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(train, "drafter_micro_batch", failing)
    nvmls = []

    class SeenNvml(telemetry.NvmlTelemetry):  # the product's telemetry, kept where the test can look at it
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            nvmls.append(self)

    monkeypatch.setattr(train, "NvmlTelemetry", SeenNvml)
    cfg = config_from_args(train_cmd(tiny, out, "--max-steps", "5", "--checkpoint-interval", "1")[3:])
    validate_paths(cfg)
    seen_open = []
    real_write = telemetry.JsonlWriter.write

    def write(self, row):  # while the run trains, its files are open
        seen_open.extend(open_run_files(out))
        return real_write(self, row)

    monkeypatch.setattr(telemetry.JsonlWriter, "write", write)
    # the service this process started goes with the test: its WANDB_SERVICE must not reach later tests' trainers
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    try:
        with pytest.raises(RuntimeError, match="micro-batch 3 failed"):
            train.run(cfg, Heartbeat(cfg.run_dir, 10.0), threading.Event())
    finally:
        wandb.teardown()

    assert [r["step"] for r in read_metrics(out)] == [1, 2] and find_latest(str(out)).endswith("step-2")
    assert {os.path.basename(p) for p in seen_open} >= {"metrics.jsonl", "snapshots.jsonl", "profile.jsonl"}
    assert open_run_files(out) == []  # metrics, snapshots, profile (and telemetry) writers closed
    assert len(nvmls) == 1 and nvmls[0]._stop.is_set() and nvmls[0]._thread is None and nvmls[0].writer is None
    assert not [t for t in threading.enumerate() if t.name == "nvml"]
    assert os.path.isdir(out / "wandb") and wandb.run is None  # the W&B run was opened, and finished
