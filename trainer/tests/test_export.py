"""Export: key names and config fields as docs/dflash.md lists them, and an exact reload round trip."""

import json
import os

import torch
from safetensors.torch import load_file

from dflash_trainer.model.blocks import block_inputs, dense_block_mask
from dflash_trainer.loop.checkpoint import save_checkpoint
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.export.exporter import export_checkpoint, load_exported_drafter
from dflash_trainer.model.target import FrozenTarget


def _checkpoint(tiny, tmp_path):
    target = FrozenTarget(tiny["target"], torch.device("cpu"), [1, 3, 5], need_last_hidden=False)
    cfg = DrafterConfig.from_target(target.config, 2, [1, 3, 5], block_size=4, mask_token_id=511)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    drafter.load_frozen(target.embed_weight(), target.lm_head_weight())
    save_checkpoint(str(tmp_path / "out"), 7, drafter.trainable_state_dict(), cfg.to_dict(), {"step": 7}, keep=2)
    return target, drafter


def test_export_keys_and_config(tiny, tmp_path):
    _checkpoint(tiny, tmp_path)
    export_checkpoint(str(tmp_path / "out"), tiny["target"], str(tmp_path / "export"))
    keys = set(load_file(str(tmp_path / "export" / "model.safetensors")))
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(2):
        expected |= {f"layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        expected |= {f"layers.{i}.self_attn.{p}_norm.weight" for p in "qk"}
        expected |= {f"layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        expected |= {f"layers.{i}.{p}_layernorm.weight" for p in ("input", "post_attention")}
    assert keys == expected
    tensors = load_file(str(tmp_path / "export" / "model.safetensors"))
    assert tensors["fc.weight"].shape == (64, 3 * 64) and tensors["fc.weight"].dtype == torch.bfloat16
    config = json.load(open(tmp_path / "export" / "config.json"))
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "intermediate_size", "rms_norm_eps", "rope_theta", "vocab_size"):
        assert field in config, field
    assert config["hidden_size"] == 64 and config["num_hidden_layers"] == 2 and config["vocab_size"] == 512
    assert config["num_target_layers"] == 8 and config["block_size"] == 4
    assert config["dflash_config"] == {"mask_token_id": 511, "mask_token": "<|MASK|>", "target_layer_ids": [1, 3, 5],
                                       "block_size": 4}


def test_export_round_trip_identical_logits(tiny, tmp_path):
    target, drafter = _checkpoint(tiny, tmp_path)
    export_checkpoint(str(tmp_path / "out" / "checkpoints" / "step-7"), tiny["target"], str(tmp_path / "e"),
                      dtype="float32")
    reloaded = load_exported_drafter(str(tmp_path / "e"), tiny["target"])
    ids = torch.randint(0, 500, (2, 20))
    taps, _ = target(ids)
    anchors, valid = torch.tensor([[2, 9], [4, 12]]), torch.ones(2, 2, dtype=torch.bool)
    block_ids, pos = block_inputs(ids, anchors, 4, 511)
    mask = dense_block_mask(anchors, valid, 20, 4)
    with torch.no_grad():
        a = drafter.eval().logits(drafter(taps, block_ids, pos, mask))
        b = reloaded.logits(reloaded(taps, block_ids, pos, mask))
    assert torch.equal(a, b)


def test_export_cli_refuses_bad_checkpoint(tiny, tmp_path):
    from dflash_trainer.export.exporter import main
    assert main(["--checkpoint", str(tmp_path), "--target-model", tiny["target"], "--out", str(tmp_path / "x")]) == 2
    assert not os.path.exists(tmp_path / "x" / "config.json")


def test_export_engine_fields(tiny, tmp_path):
    """The fields issue 19 names: both tap conventions, the mask token's string, dtype, auto_map, files."""
    _checkpoint(tiny, tmp_path)
    export_checkpoint(str(tmp_path / "out"), tiny["target"], str(tmp_path / "export"))
    config = json.load(open(tmp_path / "export" / "config.json"))
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 6]  # target_layer_ids [1, 3, 5] + 1
    assert config["dflash_config"]["mask_token"] == "<|MASK|>"  # added_tokens.json of the tiny target
    assert config["dtype"] == "bfloat16" and config["layer_types"] == ["full_attention"] * 2
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": config["rope_theta"]}
    assert "rope_scaling" not in config
    module, cls = config["auto_map"]["AutoModel"].split(".")
    assert (tmp_path / "export" / f"{module}.py").is_file() and cls == "DFlashDraftModel"


def test_export_loads_with_transformers_alone(tiny, tmp_path, monkeypatch):
    """AutoModel.from_pretrained(export, trust_remote_code=True) gives the drafter's logits exactly."""
    from transformers import AutoModel
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target, drafter = _checkpoint(tiny, tmp_path)
    export_checkpoint(str(tmp_path / "out"), tiny["target"], str(tmp_path / "e"), dtype="float32")
    model = AutoModel.from_pretrained(str(tmp_path / "e"), trust_remote_code=True, local_files_only=True,
                                      dtype=torch.float32).eval()
    assert type(model).__module__ != "dflash_trainer.model.modeling_dflash"  # the copy beside the weights
    ids = torch.randint(0, 500, (1, 20))
    taps, _ = target(ids)
    block = torch.tensor([[ids[0, -1].item(), 511, 511, 511]])
    pos = torch.arange(20, 24)[None]
    mask = torch.ones(1, 1, 4, 24, dtype=torch.bool)
    with torch.no_grad():
        ours = drafter.eval().logits(drafter(taps, block, pos, mask))
        hidden = model(torch.cat(taps, dim=-1), drafter.embed_tokens(block), pos)
        theirs = hidden @ target.lm_head_weight().T
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
