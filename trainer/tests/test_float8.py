"""DFLASH_FP8_LAYERS (float8.py): torchao's float8 training on the drafter layers' linears. The GPU speed is a
benchmark figure (train_step.py), not a test.

torchao is not in the test environment: transformers imports it whenever it is installed and its import logs to
stderr, which other tests read for dflash-train's one-line errors. So the FP8 run happens in a subprocess with the
pinned torchao (trainer/pyproject.toml's `fp8` extra) on its path, on the CPU (torch's _scaled_mm runs there);
the refusal without torchao is tested here, where it is absent."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from trainer_testlib import read_heartbeat, train_cmd

TRAINER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FP8_CHECK = r"""
import json, sys, torch
from torch import nn
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.model.float8 import float8_layers
from dflash_trainer.loop.step import drafter_micro_batch

def drafter():
    torch.manual_seed(0)
    # torchao's float8 needs dimensions that are multiples of 16
    cfg = DrafterConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, intermediate_size=128, vocab_size=256, target_layer_ids=[1, 2],
                        num_target_layers=4, block_size=8, mask_token_id=255)
    d = DFlashDrafter(cfg)
    nn.init.normal_(d.embed_tokens.weight)
    nn.init.normal_(d.lm_head.weight)
    return d

def loss_and_grad(d):
    g = torch.Generator().manual_seed(3)
    B, T = 2, 64
    ids = torch.randint(0, 250, (B, T), generator=g)
    taps = [torch.randn(B, T, 64, generator=g) for _ in range(2)]
    out = drafter_micro_batch(d, taps, None, ids, torch.ones(B, T, dtype=torch.bool), torch.full((B,), T),
                              max_anchors=4, gamma=4.0, noise_amplitude=0.0, seed=1, head_chunk_size=64,
                              soft_label_temperature=1.0)
    out.loss.backward()
    return float(out.loss), d.layers[0].mlp.up_proj.weight.grad.flatten()

reference, d = drafter(), drafter()
keys = {k: str(v.dtype) for k, v in d.state_dict().items()}
swapped = float8_layers(d, sys.argv[1])
(loss_ref, grad_ref), (loss, grad) = loss_and_grad(reference), loss_and_grad(d)
print(json.dumps({"swapped": swapped, "same_keys": keys == {k: str(v.dtype) for k, v in d.state_dict().items()},
                  "fc": type(d.fc).__name__, "lm_head": type(d.lm_head).__name__,
                  "layer_linears": sorted({type(m).__name__ for n, m in d.layers.named_modules() if "proj" in n}),
                  "loss": loss, "loss_ref": loss_ref,
                  "cosine": float(torch.nn.functional.cosine_similarity(grad, grad_ref, dim=0))}))
"""


@pytest.fixture(scope="module")
def torchao_dir(tmp_path_factory):
    """The pinned torchao, installed on its own (pip --target), not into the test environment."""
    with open(os.path.join(TRAINER, "pyproject.toml"), "rb") as f:
        (pin,) = tomllib.load(f)["project"]["optional-dependencies"]["fp8"]
    target = tmp_path_factory.mktemp("torchao")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "--no-deps", "--target", str(target), pin], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, f"pip install {pin}: {pip.stderr.strip().splitlines()[-1:]}"
    return str(target)


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_fp8_layers_swap_every_layer_linear_keep_the_checkpoint_keys_and_train(torchao_dir, recipe):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([torchao_dir, os.path.join(TRAINER, "src")]))
    run = subprocess.run([sys.executable, "-c", FP8_CHECK, recipe], capture_output=True, text=True, timeout=300,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert r["swapped"] == 2 * 7 and r["layer_linears"] == ["Float8Linear"]  # q k v o gate up down, 2 layers
    assert r["same_keys"]  # the same parameter names and dtypes: checkpoints and exports unchanged
    assert r["fc"] == r["lm_head"] == "Linear"  # fc and the frozen head stay as they were
    # e4m3 keeps ~2 significant digits: the loss is close to the fp32 one, not equal; the gradient points the same way
    assert r["loss"] != r["loss_ref"] and abs(r["loss"] - r["loss_ref"]) < 0.05 * r["loss_ref"], r
    assert r["cosine"] > 0.9, r


def test_fp8_layers_without_torchao_is_refused_in_one_line_before_anything_loads(tiny, tmp_path):
    if importlib.util.find_spec("torchao") is not None:
        pytest.skip("torchao is installed in this environment; the refusal needs it absent")
    out = tmp_path / "out"
    result = subprocess.run(train_cmd(tiny, out), capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, DFLASH_FP8_LAYERS="1"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert re.fullmatch(r"dflash-train: error: DFLASH_FP8_LAYERS \(tensorwise\) needs torchao; pip install "
                        r"'dflash_trainer\[fp8\]' or unset DFLASH_FP8_LAYERS", lines[0]), lines[0]
    # refused before loading anything: the run directory holds only the failed heartbeat the launcher reads
    assert os.listdir(out) == ["heartbeat.json"]
    heartbeat = read_heartbeat(out)
    assert heartbeat["phase"] == "failed" and heartbeat["error"] == lines[0].split("error: ", 1)[1]

    from dflash_trainer.model.float8 import float8_layers  # the benchmark's direct call has the same guard
    from test_blocks import tiny_drafter
    with pytest.raises(RuntimeError,
                       match=r"^DFLASH_FP8_LAYERS \(rowwise\) needs torchao .*pip install 'dflash_trainer\[fp8\]'"):
        float8_layers(tiny_drafter(), "rowwise")


def test_fp8_layers_unknown_recipe_is_refused_in_one_line(tiny, tmp_path):
    result = subprocess.run(train_cmd(tiny, tmp_path / "out"), capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, DFLASH_FP8_LAYERS="yes"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines == ["dflash-train: error: DFLASH_FP8_LAYERS is 'yes'; set it to auto, 0, "
                                                "1 (tensorwise) or one of tensorwise, rowwise"], result.stderr


@pytest.mark.parametrize("setting, device, capability, hidden, torchao, expected", [
    ("auto", "cuda", (9, 0), 5120, True, "tensorwise"),      # the seed's drafter on an H200: FP8 pays 1.20x
    ("auto", "cuda", (9, 0), 576, True, None),               # SmolLM2's: too small, bf16
    ("auto", "cuda", (8, 0), 5120, True, None),              # an A100 has no FP8 matmul
    ("auto", "cuda", (8, 9), 4096, True, "tensorwise"),      # from FP8_MIN_HIDDEN on
    ("auto", "cuda", (9, 0), 5120, False, None),             # torchao absent: bf16, not a refusal
    ("auto", "cpu", None, 5120, True, None),
    (None, "cuda", (9, 0), 5120, True, None),                # DFLASH_FP8_LAYERS=0
    ("rowwise", "cuda", (9, 0), 576, True, "rowwise"),       # an explicit recipe overrides the size rule
    ("tensorwise", "cpu", None, 5120, True, None),           # never on the CPU
])
def test_auto_puts_the_layers_in_fp8_where_it_pays_and_says_why(setting, device, capability, hidden, torchao,
                                                                 expected):
    from dflash_trainer.model.float8 import choose_fp8
    recipe, why = choose_fp8(setting, device, capability, hidden, torchao)
    assert recipe == expected, why
    assert why.startswith(f"FP8 {expected} (" if expected else "bf16 ("), why
    if setting == "auto" and device == "cuda" and not torchao:
        assert "pip install 'dflash_trainer[fp8]'" in why   # the fix is named


def test_dflash_train_logs_which_linears_it_trains(tiny, tmp_path):
    run = subprocess.run(train_cmd(tiny, tmp_path / "out", "--max-steps", "1"), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "drafter linears: bf16 (DFLASH_FP8_LAYERS=auto: FP8 only on CUDA)" in run.stdout + run.stderr
    vocab = json.loads(open(os.path.join(tiny["target"], "config.json")).read())["vocab_size"]
    assert f"head chunk: 4096 rows (default: fp32 logits within 1024 MiB at vocab {vocab})" in run.stdout + run.stderr
