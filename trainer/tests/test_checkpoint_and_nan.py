"""Checkpoint bookkeeping (latest, keep-last-k, incomplete dirs) and non-finite step handling in train.run."""

import os
import threading

import pytest
import torch

from trainer_testlib import read_metrics
from dflash_trainer.loop import train
from dflash_trainer.loop.checkpoint import find_latest, save_checkpoint
from dflash_trainer.cli import config_from_args
from dflash_trainer.config import validate_paths
from dflash_trainer.telemetry.heartbeat import Heartbeat


def _save(out, step, keep=2):
    return save_checkpoint(str(out), step, {"w": torch.full((2,), float(step))}, {"x": 1}, {"step": step}, keep)


def test_latest_keep_last_k_and_incomplete_dirs(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step)
    root = tmp_path / "checkpoints"
    assert sorted(os.listdir(root)) == ["latest", "step-2", "step-3"]
    os.makedirs(root / ".tmp-step-4")                     # a killed save
    os.makedirs(root / "step-9")                          # not complete: never chosen
    assert find_latest(str(tmp_path)).endswith("step-3")
    (root / "latest").write_text("step-77\n")             # dangling: fall back to newest complete
    assert find_latest(str(tmp_path)).endswith("step-3")
    _save(tmp_path, 4)
    assert not (root / ".tmp-step-4").exists() and find_latest(str(tmp_path)).endswith("step-4")


def _run(tiny, tmp_path, monkeypatch, num_poisoned, *extra):
    """train.run with the first `num_poisoned` micro-batch losses turned into NaN."""
    real = train.drafter_micro_batch
    calls = []

    def poisoned(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) <= num_poisoned:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(train, "drafter_micro_batch", poisoned)
    cfg = config_from_args(["--target-model", tiny["target"], "--data-dir", tiny["data"], "--output-dir",
                            str(tmp_path), "--block-size", "4", "--max-anchors", "8", "--num-draft-layers", "1",
                            "--token-budget", "512", "--max-seq-len", "256", "--grad-accum", "1",
                            "--log-interval", "1", *extra])
    validate_paths(cfg)  # as cli.main does before train.run
    return cfg, train.run(cfg, Heartbeat(cfg.run_dir, 10.0), threading.Event())


def test_nan_steps_are_skipped_and_counted(tiny, tmp_path, monkeypatch):
    cfg, status = _run(tiny, tmp_path, monkeypatch, 2, "--max-steps", "3")
    assert status == 0
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["num_bad_steps"] == 2
    assert all(r["loss"] == r["loss"] for r in rows)  # no NaN reached an update


def test_too_many_nan_steps_in_a_row_halt(tiny, tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="non-finite steps in a row"):
        _run(tiny, tmp_path, monkeypatch, 10**9, "--max-steps", "50", "--max-bad-steps", "3")


def test_drafter_adamw_is_fused_on_cuda_only_and_its_state_moves_between_kinds():
    """One optimizer for dflash-train and the step benchmark: fused on CUDA (not for FSDP's DTensor shards),
    default elsewhere; a foreach optimizer's state loads into another built the same way."""
    from dflash_trainer.loop.optimizer import drafter_adamw
    w = torch.nn.Parameter(torch.randn(4, 4))
    cpu = drafter_adamw([w], 1e-3, 0.01, "cpu")
    assert cpu.defaults["fused"] is None and cpu.defaults["lr"] == 1e-3 and cpu.defaults["weight_decay"] == 0.01
    w.grad = torch.ones_like(w)
    cpu.step()
    again = drafter_adamw([w], 1e-3, 0.01, "cpu")
    again.load_state_dict(cpu.state_dict())
    assert torch.equal(again.state[w]["exp_avg"], cpu.state[w]["exp_avg"])
    if torch.cuda.is_available():
        assert drafter_adamw([torch.nn.Parameter(torch.randn(2, device="cuda"))], 1e-3, 0.0, "cuda").defaults["fused"]
        assert not drafter_adamw([torch.nn.Parameter(torch.randn(2, device="cuda"))], 1e-3, 0.0, "cuda",
                                 sharded=True).defaults["fused"]
