"""The drafter's RoPE (drafter.drafter_rope): the target's linear/yarn/llama3 scaling, checked against the
target model's own rotary embedding (transformers), on the whole head; the target's partial_rotary_factor and
dynamic NTK are not the drafter's (whole head, default RoPE). Carried through training and export; checkpoints
trained before with a partial rotary still export and load as they were trained."""

import json

import pytest
import torch

from dflash_trainer.model.blocks import block_inputs, dense_block_mask
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig, apply_rope, drafter_rope, rope_cos_sin

ROPES = {
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn-quarter": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                     "original_max_position_embeddings": 64, "partial_rotary_factor": 0.25},
}
MAX_POS = 128


def _qwen3(rope):
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       max_position_embeddings=MAX_POS, rope_parameters=dict(rope))


def _qwen3_next_quarter():
    """The seed's family: default RoPE on a quarter of each head (Qwen3-Next / Qwen3.5)."""
    from transformers import Qwen3NextConfig
    return Qwen3NextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           max_position_embeddings=MAX_POS, partial_rotary_factor=0.25,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _targets():
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRotaryEmbedding
    from transformers.models.qwen3_next.modeling_qwen3_next import apply_rotary_pos_emb as next_apply
    out = {name: (_qwen3(r), Qwen3RotaryEmbedding, next_apply) for name, r in ROPES.items()}
    out["default-quarter"] = (_qwen3_next_quarter(), Qwen3NextRotaryEmbedding, next_apply)
    return out


def _drafter_cfg(target_config):
    return DrafterConfig.from_target(target_config, 1, [1, 3, 5], block_size=4, mask_token_id=511)


# The types the drafter keeps from a full-rotary target; `dynamic` and partial rotary: see test_target_only_rope.
KEPT = ("llama3", "yarn", "linear")
# A drafter config as from_target wrote it before drafter_rope: the target's quarter rotary kept.
LEGACY_QUARTER = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}


@pytest.mark.parametrize("name", KEPT)
def test_rope_matches_target(name):
    config, rotary_cls, hf_apply = _targets()[name]
    cfg = _drafter_cfg(config)
    assert cfg.rope_parameters == config.rope_parameters
    # past the original length, so length-dependent types (dynamic) and scaled ones differ from plain RoPE
    positions = torch.arange(0, 200)[None]  # MAX_POS is 128
    x = torch.zeros(1, 1, 200, 16)
    hf_cos, hf_sin = rotary_cls(config)(x, positions)
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg)
    torch.testing.assert_close(cos[:, 0], hf_cos, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin[:, 0], hf_sin, rtol=1e-5, atol=1e-5)
    plain_cos, _ = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
    assert plain_cos.shape != cos.shape or not torch.allclose(plain_cos, cos), "the type changed nothing"
    # the rotation itself, partial heads included, equals the target family's apply_rotary_pos_emb
    q, k = torch.randn(1, 4, 200, 16), torch.randn(1, 2, 200, 16)
    hf_q, hf_k = hf_apply(q, k, hf_cos, hf_sin)
    torch.testing.assert_close(apply_rope(q, cos, sin), hf_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(apply_rope(k, cos, sin), hf_k, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["dynamic", "yarn-quarter", "default-quarter"])
def test_target_only_rope(name):
    """The drafter rotates its whole head whatever the target's partial_rotary_factor (SGLang's DFlash model
    rotates the whole head), and a dynamic target's drafter uses default RoPE (the engines' dynamic NTK agree
    neither with each other nor with training); a yarn-quarter target keeps its yarn on the whole head."""
    config = _targets()[name][0]
    cfg = _drafter_cfg(config)
    want = drafter_rope(dict(config.rope_parameters))
    assert cfg.rope_parameters == want and "partial_rotary_factor" not in (want or {})
    assert (want or {}).get("rope_type") == ("yarn" if name == "yarn-quarter" else None)
    positions = torch.arange(0, 200)[None]
    cos, _ = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg)
    assert cos.shape[-1] == cfg.head_dim
    if want is None:  # the historical plain path, numbers equal to it
        assert torch.equal(cos, rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)[0])


def test_legacy_partial_rotary_still_applies():
    """A checkpoint trained before drafter_rope (quarter rotary) still runs as it was trained."""
    cfg = DrafterConfig.from_dict(_drafter_cfg(_qwen3(ROPES["linear"])).to_dict() | {"rope_parameters": LEGACY_QUARTER})
    positions = torch.arange(0, 20)[None]
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg)
    q = torch.randn(1, 4, 20, 16)
    assert cos.shape[-1] == 4 and torch.equal(apply_rope(q, cos, sin)[..., 4:], q[..., 4:])


def test_default_rope_keeps_no_rope_parameters(tiny):
    """Plain RoPE stays on the historical path: config equal to earlier checkpoints', same numbers."""
    from transformers import AutoConfig
    cfg = _drafter_cfg(AutoConfig.from_pretrained(tiny["target"]))
    assert cfg.rope_parameters is None
    assert DrafterConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "rope_parameters"}) == cfg


@pytest.mark.parametrize("name", ["llama3", "yarn-quarter"])
def test_training_forward_uses_target_rope_and_export_declares_it(name, tmp_path):
    """The drafter's forward (the one training runs) applies the target's rope; the export says so."""
    from dflash_trainer.export.exporter import export_config
    config = _targets()[name][0]
    cfg = _drafter_cfg(config)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).eval()
    plain = DFlashDrafter(DrafterConfig.from_dict(cfg.to_dict() | {"rope_parameters": None})).eval()
    plain.load_state_dict(drafter.state_dict())
    ids = torch.randint(0, 500, (1, 90))
    taps = [torch.randn(1, 90, 64) for _ in range(3)]
    anchors, valid = torch.tensor([[10, 80]]), torch.ones(1, 2, dtype=torch.bool)
    block_ids, pos = block_inputs(ids, anchors, 4, 511)
    mask = dense_block_mask(anchors, valid, 90, 4)
    with torch.no_grad():
        assert not torch.allclose(drafter(taps, block_ids, pos, mask), plain(taps, block_ids, pos, mask))
    exported = export_config(cfg, json.loads(config.to_json_string()), "bfloat16")
    declared = exported["rope_parameters"]
    for key, value in cfg.rope_parameters.items():
        assert declared[key] == value, key
    assert declared["rope_type"] == config.rope_parameters["rope_type"]
    assert "partial_rotary_factor" not in exported and "partial_rotary_factor" not in declared


@pytest.mark.parametrize("name", ["llama3", "legacy-quarter"])
def test_export_of_a_scaled_rope_round_trips(name, tmp_path, monkeypatch):
    """The export's config gives back the trained DrafterConfig, and transformers alone gives its logits."""
    from transformers import AutoModel

    from dflash_trainer.loop.checkpoint import save_checkpoint
    from dflash_trainer.export.exporter import export_checkpoint
    from dflash_trainer.model.modeling_dflash import drafter_config_from_export
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = _targets()["llama3" if name == "llama3" else "default-quarter"][0]
    target_dir = tmp_path / "target"
    config.save_pretrained(target_dir)
    cfg = _drafter_cfg(config)
    if name == "legacy-quarter":
        cfg = DrafterConfig.from_dict(cfg.to_dict() | {"rope_parameters": LEGACY_QUARTER})
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg).eval()
    save_checkpoint(str(tmp_path / "out"), 1, drafter.trainable_state_dict(), cfg.to_dict(), {"step": 1}, keep=1)
    export_checkpoint(str(tmp_path / "out"), str(target_dir), str(tmp_path / "e"), dtype="float32")
    exported = json.load(open(tmp_path / "e" / "config.json"))
    assert drafter_config_from_export(exported) == cfg
    model = AutoModel.from_pretrained(str(tmp_path / "e"), trust_remote_code=True, local_files_only=True,
                                      dtype=torch.float32).eval()
    taps = [torch.randn(1, 150, 64) for _ in range(3)]
    block = torch.tensor([[7, 511, 511, 511]])
    pos = torch.arange(150, 154)[None]
    mask = torch.ones(1, 1, 4, 154, dtype=torch.bool)
    with torch.no_grad():
        ours = drafter(taps, block, pos, mask)
        theirs = model(torch.cat(taps, dim=-1), drafter.embed_tokens(block), pos)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
