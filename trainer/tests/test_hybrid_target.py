"""The seed target's family (Qwen3.5/3.6: Gated DeltaNet + full attention, Qwen3_5Config nesting a text_config):
dflash-train taps the right layers and trains on it, in one process and as 1 target + 1 drafter rank (gloo).

On the CPU transformers runs its torch fallbacks of the linear-attention kernels (torch_chunk_gated_delta_rule,
F.conv1d for causal_conv1d), which the tests assert, so a run that silently picked another path shows."""

import json
import math
import os

import pytest
import torch

from trainer_testlib import read_metrics, start, torchrun_cmd, train_cmd
from test_dist_train import _close_to, losses
from dflash_trainer.prep.make_tiny import write_dataset, write_target

STEPS = 12


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    target, data = str(root / "target"), str(root / "data")
    write_target(target, seed=0, family="qwen3_5")
    write_dataset(data, num_sequences=96, seed=0)
    return {"target": target, "data": data}


@pytest.fixture(scope="module")
def one_process(hybrid, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    proc = start(train_cmd(hybrid, out / "run", "--max-steps", str(STEPS)), out / "log")
    assert proc.wait(timeout=300) == 0, (out / "log").read_text()[-3000:]
    return out


def test_saved_as_the_27b_checkpoints_are_and_loaded_as_the_text_model(hybrid):
    with open(os.path.join(hybrid["target"], "config.json")) as f:
        saved = json.load(f)
    assert saved["model_type"] == "qwen3_5" and saved["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert saved["text_config"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + \
        ["linear_attention"] * 3 + ["full_attention"]
    from dflash_trainer.model.target import FrozenTarget
    target = FrozenTarget(hybrid["target"], torch.device("cpu"), [1, 3, 5], need_last_hidden=False)
    assert type(target.model).__name__ == "Qwen3_5ForCausalLM"
    assert type(target.config).__name__ == "Qwen3_5TextConfig"
    import transformers.models.qwen3_5.modeling_qwen3_5 as qwen3_5
    # the torch paths (the CPU has no flash-linear-attention / causal-conv1d)
    assert qwen3_5.torch_chunk_gated_delta_rule.__wrapped__.__module__ == qwen3_5.__name__


def test_taps_are_the_outputs_of_the_tapped_linear_and_full_attention_layers(hybrid):
    from dflash_trainer.model.target import FrozenTarget
    layer_ids = [1, 3, 5]  # linear, full, linear attention
    target = FrozenTarget(hybrid["target"], torch.device("cpu"), layer_ids, need_last_hidden=True)
    layers = target.model.model.layers
    assert [target.config.layer_types[i] for i in layer_ids] == ["linear_attention", "full_attention",
                                                                 "linear_attention"]
    assert [hasattr(layers[i], "linear_attn") for i in layer_ids] == [True, False, True]
    seen = {}
    hooks = [layers[i].register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, out[0] if isinstance(
        out, tuple) else out)) for i in layer_ids]
    ids = torch.randint(2, 500, (2, 70))  # longer than one 64-token chunk of the gated delta rule
    taps, last = target(ids)
    for h in hooks:
        h.remove()
    for i, tap in zip(layer_ids, taps):
        assert torch.equal(tap, seen[i]), f"tap of layer {i} is not that layer's output"
    assert not torch.equal(taps[0], taps[2]) and last.shape == (2, 70, 64)


def test_one_process_trains_loss_finite_and_falling(one_process):
    rows = read_metrics(one_process / "run")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    loss = [r["loss"] for r in rows]
    assert all(math.isfinite(x) for x in loss), loss
    assert sum(loss[-4:]) / 4 < 0.8 * sum(loss[:4]) / 4, loss
    assert "falling back to its reference PyTorch implementation" in (one_process / "log").read_text()


def test_one_target_one_drafter_rank_trains_as_one_process(hybrid, one_process, tmp_path):
    out = tmp_path / "out"
    proc = start(torchrun_cmd(hybrid, out, 2, 1, "--max-steps", str(STEPS), "--hs-queue-depth", "3",
                              "--hs-queue-min-ready", "2"), tmp_path / "log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "log").read_text()[-3000:]
    rows = losses(out)
    assert [r[0] for r in rows] == list(range(1, STEPS + 1))
    _close_to(rows, losses(one_process / "run"))
