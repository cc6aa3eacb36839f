"""Refusals at start: one line on stderr, exit 2, heartbeat `failed` with the error; stdlib-only entry."""

import os
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer_testlib import read_heartbeat, train_cmd


def _run(cmd, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def _no_loss_mask_dir(tmp_path):
    d = tmp_path / "nomask"
    d.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int32()))}), d / "x.parquet")
    return str(d)


CASES = {
    "block size": (["--block-size", "1"], "--block-size"),
    "gamma": (["--gamma", "0"], "--gamma"),
    "missing model": (["--target-model", "/nonexistent/model"], "--target-model"),
    "mask token": (["--mask-token-id", "512"], "--mask-token-id"),
    "gpus without cuda": (["--target-gpus", "0,1", "--drafter-gpus", "2"], "CUDA"),
    "bad gpu list": (["--target-gpus", "a,b"], "--target-gpus"),
    "unknown flag": (["--frobnicate"], "--help"),
    "temperature without soft labels": (["--soft-label-temperature", "0.5"], "add --use-soft-labels"),
    "decay ratio without wsd": (["--lr-decay-ratio", "0.5"], "add --lr-schedule wsd"),
    "decay ratio out of range": (["--lr-schedule", "wsd", "--lr-decay-ratio", "1.5"], "--lr-decay-ratio is 1.5"),
    "temperature zero": (["--use-soft-labels", "--soft-label-temperature", "0"], "--soft-label-temperature is 0"),
    "shard weights grammar": (["--shard-weights", "synth-"], "is not PREFIX=N"),
    "shard weights prefix": (["--shard-weights", "synth-=2"], "--shard-weights synth-: no shard of"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refusal_is_one_line_exit_2_and_failed_heartbeat(tiny, tmp_path, name):
    extra, needle = CASES[name]
    result = _run(train_cmd(tiny, tmp_path / "out", *extra))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dflash-train: error: ") and needle in lines[0], result.stderr
    hb = read_heartbeat(tmp_path / "out")
    assert hb["phase"] == "failed" and hb["error"] and hb["pid"] > 0
    assert not os.path.exists(tmp_path / "out" / "checkpoints")


@pytest.mark.parametrize("name,value", [("DFLASH_EAGER_LAYERS", "yes"), ("DFLASH_SPLIT_FC_LAYERS", "2"),
                                        ("DFLASH_PROFILE_INTERVAL", "soon"),
                                        ("DFLASH_EAGER_HEAD_LOSS", "true")])
def test_bad_environment_knob_refused_in_one_line(tiny, tmp_path, name, value):
    result = _run(train_cmd(tiny, tmp_path / "out"), env={name: value})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "set it to" in lines[0], result.stderr  # the problem and the fix
    assert read_heartbeat(tmp_path / "out")["phase"] == "failed"


def test_data_without_loss_mask_refused(tiny, tmp_path):
    cmd = train_cmd(tiny, tmp_path / "out")
    cmd[cmd.index("--data-dir") + 1] = _no_loss_mask_dir(tmp_path)
    result = _run(cmd)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "loss_mask" in result.stderr
    assert read_heartbeat(tmp_path / "out")["phase"] == "failed"


def test_entry_module_imports_no_torch():
    code = ("import sys; import dflash_trainer.cli, dflash_trainer.config, dflash_trainer.telemetry.heartbeat; "
            "heavy = [m for m in ('torch', 'transformers', 'numpy', 'pyarrow') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    result = _run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stdout + result.stderr


def test_first_heartbeat_written_before_torch_import(tiny, tmp_path):
    """python -X importtime prints a module's line on stderr when its import *completes*; the torch import
    takes seconds. The heartbeat (phase loading, our pid) must already exist when torch's line appears."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-X", "importtime", *train_cmd(tiny, out, "--max-steps", "1")[1:]]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen_torch = None
    for line in proc.stderr:
        if re.search(r"\|\s+torch$", line.rstrip()):
            seen_torch = read_heartbeat(out)
            break
    proc.stderr.read()
    proc.wait(timeout=120)
    assert seen_torch is not None and seen_torch["phase"] == "loading" and seen_torch["pid"] == proc.pid
    assert proc.returncode == 0


def test_help_lists_every_flag():
    out = _run([sys.executable, "-m", "dflash_trainer.cli", "--help"]).stdout
    for flag in ("--target-model", "--data-dir", "--output-dir", "--target-gpus", "--drafter-gpus", "--epochs",
                 "--lr", "--warmup-ratio", "--weight-decay", "--grad-accum", "--grad-clip", "--token-budget",
                 "--max-seq-len", "--max-batch-size", "--block-size", "--max-anchors", "--num-draft-layers",
                 "--gamma", "--noise", "--noise-start", "--noise-end", "--use-soft-labels", "--run-dir", "--seed",
                 "--checkpoint-interval", "--mask-token-id", "--target-layer-ids", "--heartbeat-interval",
                 "--max-steps", "--keep-checkpoints", "DFLASH_PROFILE_INTERVAL", "DFLASH_SPLIT_FC_LAYERS",
                 "DFLASH_EAGER_LAYERS"):
        assert flag in out, flag


@pytest.mark.parametrize("value,compiled", [(None, True), ("0", True), ("1", False)])
def test_eager_layers_knob_reaches_the_config(tiny, tmp_path, monkeypatch, value, compiled):
    from dflash_trainer.cli import config_from_args
    if value is None:
        monkeypatch.delenv("DFLASH_EAGER_LAYERS", raising=False)
    else:
        monkeypatch.setenv("DFLASH_EAGER_LAYERS", value)
    assert config_from_args(train_cmd(tiny, tmp_path / "out")[3:]).compile_layers is compiled


def test_shard_weights_train_and_count_the_epoch(tiny, tmp_path):
    """A run with --shard-weights trains, and its data line counts the weighted epoch."""
    weighted = _run(train_cmd(tiny, tmp_path / "out", "--max-steps", "1", "--shard-weights",
                              "shard-00000=0,shard-00001=3"))
    assert weighted.returncode == 0, weighted.stderr
    line = next(x for x in (weighted.stdout + weighted.stderr).splitlines() if "data: " in x)
    rows = [r for r in pq.read_table(os.path.join(tiny["data"], "shard-00001.parquet")).column("input_ids").to_pylist()
            if len(r) >= 2]
    assert f"({3 * len(rows)} sequences an epoch by --shard-weights shard-00000=0,shard-00001=3)" in line
