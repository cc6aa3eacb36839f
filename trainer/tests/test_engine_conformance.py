"""Engine conformance: the config fields and weight names SGLang and vLLM read when they load a DFlash draft,
checked against an export of the tiny drafter. The engines' wheels are too large to run here, so the table is
the test: every row cites the file and line it was read from.

Read on 2026-12-01 from the released sources (PyPI wheels, unpacked; the repositories' paths are the same under
python/ for SGLang):
  SGLang  sgl-project/sglang tag v0.5.23 (wheel sglang-0.5.23; its _version.py records no commit id)
  vLLM    vllm-project/vllm v0.33.0, commit 4ba787ec9 (wheel vllm-0.33.0, vllm/_version.py)
A row fails with the field's name and where the engine reads it.

The RoPE rows are semantic: for the tiny qwen3_5 target (the seed's family, a quarter-rotary head) and for each
rope type a drafter trains with (default, linear, dynamic, yarn, llama3), the rotation each engine computes from
the export (tests/engine_rope.py, the engine's get_rope read at the versions above) equals the one training
applied (drafter.rope_cos_sin of the checkpoint's config). The issue's SGLang commits 003b23d7 and 7f151c5e
rotate the whole head unconditionally (get_rope(head_dim, rotary_dim=head_dim, ...)); v0.5.23 reads a top-level
partial_rotary_factor attribute, which transformers 5 folds into rope_parameters, so it rotates the whole head too.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from dflash_trainer.loop.checkpoint import load_checkpoint, save_checkpoint
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig, rope_cos_sin
from dflash_trainer.export.exporter import export_checkpoint
from dflash_trainer.prep.make_tiny import qwen3_config, write_target

from engine_rope import SG_DFLASH, SG_ROPE, VL_DFLASH, VL_ROPE, engine_rotation

SGLANG = "sgl-project/sglang@v0.5.23"
VLLM = "vllm-project/vllm@v0.33.0 (4ba787ec9)"
SG_MODEL, SG_UTILS = "python/sglang/srt/models/dflash.py", "python/sglang/srt/speculative/dflash_utils.py"
SG_WORKER = "python/sglang/srt/speculative/dflash_worker_v2.py"
SG_HF = "python/sglang/srt/utils/hf_transformers/common.py"
SG_QWEN3 = "python/sglang/srt/models/qwen3.py"
VL_MODEL, VL_AUX = "vllm/model_executor/models/qwen3_dflash.py", "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
VL_REGISTRY, VL_MLP = "vllm/model_executor/models/registry.py", "vllm/model_executor/models/qwen2.py"


def _get(config, dotted):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


# Checks beyond presence: (config, tensors, target_dir) -> an error string or None.
def _arch(name):
    return lambda c, t, d: None if name in c["architectures"] else f"architectures lacks {name}"


def _fc_from(ids_of):
    def check(c, t, d):
        H, n = c["hidden_size"], len(ids_of(c))
        want = (H, n * H)
        got = tuple(t["fc.weight"])
        return None if got == want else f"fc.weight is {got}, engine builds {want}"
    return check


def _aux_plus_one(c, t, d):
    want = [i + 1 for i in c["dflash_config"]["target_layer_ids"]]
    got = c["eagle_aux_hidden_state_layer_ids"]
    if got == want:
        return None
    return f"eagle_aux_hidden_state_layer_ids {got} != dflash_config.target_layer_ids + 1 {want}"


def _layer_types(c, t, d):
    lt = c["layer_types"]
    ok = len(lt) == c["num_hidden_layers"] and all(x == "full_attention" for x in lt)
    return None if ok else f"layer_types {lt} must be one full_attention (non-causal) entry per draft layer"


def _mask_token_in_vocab(c, t, d):
    """SGLang: the tokenizer's id for dflash_config.mask_token must equal mask_token_id."""
    with open(f"{d}/added_tokens.json") as f:
        vocab = json.load(f)
    token, token_id = c["dflash_config"]["mask_token"], c["dflash_config"]["mask_token_id"]
    if token in vocab and vocab[token] != token_id:
        return f"mask_token {token!r} is id {vocab[token]} in the tokenizer, not mask_token_id {token_id}"
    return None


def _equals(key, value):
    return lambda c, t, d: None if _get(c, key) == value else f"{key} is {_get(c, key)!r}, engine needs {value!r}"


def _rope_theta(c, t, d):
    return None if "rope_theta" in c["rope_parameters"] else "rope_parameters lacks rope_theta"


# (kind, name, where the engine reads it, extra check or None). kind: "config" (dotted path) or "weight" (key
# template, {i} = each draft layer).
TABLE = {
    "sglang": [
        ("config", "architectures", f"{SG_MODEL}:1317 (EntryClass DFlashDraftModel)", _arch("DFlashDraftModel")),
        ("config", "hidden_size", f"{SG_MODEL}:691", None),
        ("config", "num_hidden_layers", f"{SG_MODEL}:692", None),
        ("config", "num_attention_heads", f"{SG_MODEL}:206", None),
        ("config", "num_key_value_heads", f"{SG_MODEL}:208", None),
        ("config", "head_dim", f"{SG_MODEL}:210", None),
        ("config", "attention_bias", f"{SG_MODEL}:235", _equals("attention_bias", False)),
        ("config", "rms_norm_eps", f"{SG_MODEL}:236", None),
        ("config", "rope_parameters", f"{SG_MODEL}:252 via {SG_HF}:513", _rope_theta),
        ("config", "max_position_embeddings", f"{SG_MODEL}:270", None),
        ("config", "intermediate_size", f"{SG_MODEL}:473", None),
        ("config", "hidden_act", f"{SG_MODEL}:493", _equals("hidden_act", "silu")),
        ("config", "layer_types", f"{SG_UTILS}:390, {SG_MODEL}:166-188", _layer_types),
        ("config", "num_target_layers", f"{SG_UTILS}:599", None),
        ("config", "dflash_config.block_size", f"{SG_UTILS}:610", None),
        # the output of target layer k (HF hidden_states[k + 1]): SGLang captures before layer k + 1
        ("config", "dflash_config.target_layer_ids", f"{SG_UTILS}:658, {SG_QWEN3}:803-805",
         _fc_from(lambda c: c["dflash_config"]["target_layer_ids"])),
        ("config", "dflash_config.mask_token", f"{SG_UTILS}:678, {SG_WORKER}:1412", _mask_token_in_vocab),
        ("config", "dflash_config.mask_token_id", f"{SG_UTILS}:689", None),
        ("weight", "layers.{i}.self_attn.q_proj.weight", f"{SG_MODEL}:889", None),
        ("weight", "layers.{i}.self_attn.k_proj.weight", f"{SG_MODEL}:890", None),
        ("weight", "layers.{i}.self_attn.v_proj.weight", f"{SG_MODEL}:891", None),
        ("weight", "layers.{i}.self_attn.o_proj.weight", f"{SG_MODEL}:239", None),
        ("weight", "layers.{i}.self_attn.q_norm.weight", f"{SG_MODEL}:249", None),
        ("weight", "layers.{i}.self_attn.k_norm.weight", f"{SG_MODEL}:250", None),
        ("weight", "layers.{i}.mlp.gate_proj.weight", f"{SG_MODEL}:892", None),
        ("weight", "layers.{i}.mlp.up_proj.weight", f"{SG_MODEL}:893", None),
        ("weight", "layers.{i}.mlp.down_proj.weight", f"{SG_MODEL}:486", None),
        ("weight", "layers.{i}.input_layernorm.weight", f"{SG_MODEL}:611", None),
        ("weight", "layers.{i}.post_attention_layernorm.weight", f"{SG_MODEL}:619", None),
        ("weight", "fc.weight", f"{SG_MODEL}:772", None),
        ("weight", "hidden_norm.weight", f"{SG_MODEL}:775", None),
        ("weight", "norm.weight", f"{SG_MODEL}:745", None),
    ],
    "vllm": [
        ("config", "architectures", f"{VL_REGISTRY}:664 (DFlashDraftModel -> qwen3_dflash)",
         _arch("DFlashDraftModel")),
        ("config", "hidden_size", f"{VL_MODEL}:310", None),
        ("config", "num_hidden_layers", f"{VL_MODEL}:473", None),
        ("config", "num_attention_heads", f"{VL_MODEL}:335", None),
        ("config", "max_position_embeddings", f"{VL_MODEL}:336", None),
        ("config", "num_key_value_heads", f"{VL_MODEL}:337", None),
        ("config", "rms_norm_eps", f"{VL_MODEL}:338", None),
        ("config", "attention_bias", f"{VL_MODEL}:339", _equals("attention_bias", False)),
        ("config", "head_dim", f"{VL_MODEL}:345", None),
        ("config", "rope_parameters", f"{VL_MODEL}:348", _rope_theta),
        ("config", "intermediate_size", f"{VL_MODEL}:354", None),
        ("config", "hidden_act", f"{VL_MODEL}:355", _equals("hidden_act", "silu")),
        ("config", "layer_types", f"{VL_MODEL}:70,121 (sliding_attention = causal)", _layer_types),
        ("config", "dflash_config.mask_token_id", f"{VL_MODEL}:454-455", None),
        ("config", "dflash_config.target_layer_ids", f"{VL_AUX}:121-124 (+1 when the next row is absent)", None),
        # read first; older versions read only this and otherwise sized fc from num_hidden_layers (issue 19)
        ("config", "eagle_aux_hidden_state_layer_ids", f"{VL_AUX}:119, {VL_MODEL}:89",
         lambda c, t, d: _aux_plus_one(c, t, d) or _fc_from(lambda c: c["eagle_aux_hidden_state_layer_ids"])(c, t, d)),
        ("weight", "layers.{i}.self_attn.q_proj.weight", f"{VL_MODEL}:404", None),
        ("weight", "layers.{i}.self_attn.k_proj.weight", f"{VL_MODEL}:405", None),
        ("weight", "layers.{i}.self_attn.v_proj.weight", f"{VL_MODEL}:406", None),
        ("weight", "layers.{i}.self_attn.o_proj.weight", f"{VL_MODEL}:214", None),
        ("weight", "layers.{i}.self_attn.q_norm.weight", f"{VL_MODEL}:265", None),
        ("weight", "layers.{i}.self_attn.k_norm.weight", f"{VL_MODEL}:266", None),
        ("weight", "layers.{i}.mlp.gate_proj.weight", f"{VL_MODEL}:407", None),
        ("weight", "layers.{i}.mlp.up_proj.weight", f"{VL_MODEL}:408", None),
        ("weight", "layers.{i}.mlp.down_proj.weight", f"{VL_MODEL}:352 -> {VL_MLP}:98", None),
        ("weight", "layers.{i}.input_layernorm.weight", f"{VL_MODEL}:359", None),
        ("weight", "layers.{i}.post_attention_layernorm.weight", f"{VL_MODEL}:360", None),
        ("weight", "fc.weight", f"{VL_MODEL}:485", None),
        ("weight", "hidden_norm.weight", f"{VL_MODEL}:488", None),
        ("weight", "norm.weight", f"{VL_MODEL}:492", None),
    ],
}
SOURCES = {"sglang": SGLANG, "vllm": VLLM}


def conformance_errors(engine: str, config: dict, shapes: dict, target_dir: str) -> list[str]:
    """One line per row the export fails: the field or weight, and where the engine reads it."""
    errors = []
    for kind, name, where, check in TABLE[engine]:
        cite = f"({SOURCES[engine]} {where})"
        if kind == "weight":
            names = [name.format(i=i) for i in range(config.get("num_hidden_layers", 0))] if "{i}" in name else [name]
            absent = [n for n in names if n not in shapes]
            if absent:
                errors.append(f"missing weight {absent[0]} {cite}")
            continue
        try:
            _get(config, name)
        except KeyError:
            errors.append(f"missing config field {name} {cite}")
            continue
        problem = check(config, shapes, target_dir) if check else None
        if problem:
            errors.append(f"{name}: {problem} {cite}")
    return errors


@pytest.fixture(scope="module")
def tiny_export(tiny, tmp_path_factory):
    from transformers import AutoConfig
    root = tmp_path_factory.mktemp("conformance")
    cfg = DrafterConfig.from_target(AutoConfig.from_pretrained(tiny["target"]), 2, [1, 3, 5], block_size=4,
                                    mask_token_id=511)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    save_checkpoint(str(root / "out"), 1, drafter.trainable_state_dict(), cfg.to_dict(), {"step": 1}, keep=1)
    export_checkpoint(str(root / "out"), tiny["target"], str(root / "export"))
    config = json.load(open(root / "export" / "config.json"))
    shapes = {k: tuple(v.shape) for k, v in load_file(str(root / "export" / "model.safetensors")).items()}
    return config, shapes, tiny["target"]


@pytest.mark.parametrize("engine", sorted(TABLE))
def test_export_conforms(engine, tiny_export):
    config, shapes, target_dir = tiny_export
    errors = conformance_errors(engine, config, shapes, target_dir)
    assert not errors, "\n".join(errors)


def test_engine_weights_are_exactly_the_export(tiny_export):
    """Neither engine is handed a weight it does not read (no embed_tokens, no lm_head)."""
    config, shapes, _ = tiny_export
    for engine, rows in TABLE.items():
        read = {name.format(i=i) for kind, name, _, _ in rows if kind == "weight"
                for i in range(config["num_hidden_layers"])}
        assert read == set(shapes), engine


@pytest.mark.parametrize("engine,field", [("vllm", "eagle_aux_hidden_state_layer_ids"),
                                          ("sglang", "dflash_config.mask_token"), ("sglang", "layer_types")])
def test_missing_field_is_named(engine, field, tiny_export):
    config, shapes, target_dir = tiny_export
    broken = json.loads(json.dumps(config))
    parent, _, leaf = field.rpartition(".")
    del (_get(broken, parent) if parent else broken)[leaf]
    errors = conformance_errors(engine, broken, shapes, target_dir)
    assert errors and all(field in e for e in errors) and ".py:" in errors[0]


def test_wrong_tap_convention_and_shape_are_caught(tiny_export):
    config, shapes, target_dir = tiny_export
    broken = json.loads(json.dumps(config))
    broken["eagle_aux_hidden_state_layer_ids"] = broken["dflash_config"]["target_layer_ids"]  # no +1
    assert any("target_layer_ids + 1" in e for e in conformance_errors("vllm", broken, shapes, target_dir))
    narrow = dict(shapes, **{"fc.weight": (64, 2 * 64)})
    assert any("fc.weight" in e for e in conformance_errors("sglang", config, narrow, target_dir))


# The semantic RoPE rows: engine -> where its DFlash attention's rotation is built.
ROPE_ROWS = {
    "sglang": f"{SGLANG} {SG_DFLASH}:252-275 (get_rope(head_dim, rotary_dim=head_dim, ...)), "
              f"{SG_ROPE}factory.py:125-340",
    "vllm": f"{VLLM} {VL_DFLASH}:222,348 (get_rope(head_dim, rope_parameters=...)), {VL_ROPE}__init__.py:32-290",
}
# The rope types a drafter trains with, on the tiny Qwen3 target's shape (yarn: max positions = factor x original).
TRAINED_ROPES = {
    "default": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
}


def rope_errors(engine: str, export_dir: str, trained: DrafterConfig) -> list[str]:
    """One line when the rotation `engine` applies to the export differs from the one training applied."""
    positions = torch.arange(min(trained.max_position_embeddings, 1024))
    got = engine_rotation(engine, export_dir, positions)
    cos, sin = (t[0, 0] for t in rope_cos_sin(positions[None], trained.head_dim, trained.rope_theta, trained))
    cite = f"({ROPE_ROWS[engine]})"
    if got.rotary_dim != cos.shape[-1]:
        return [f"{engine}: rope_parameters.partial_rotary_factor: the engine rotates {got.rotary_dim} of "
                f"{trained.head_dim} channels per head, training rotated {cos.shape[-1]} {cite}"]
    worst = float(torch.maximum((got.cos - cos).abs().max(), (got.sin - sin).abs().max()))
    if worst > 1e-3:
        kind = (trained.rope_parameters or {}).get("rope_type", "default")
        return [f"{engine}: rope_parameters.rope_type: the engine's {kind} rotation differs from training's by "
                f"up to {worst:.3g} {cite}"]
    return []


def _export(root, target_dir: str, cfg: DrafterConfig) -> tuple[str, DrafterConfig]:
    """Checkpoint `cfg` (as training does), export it; returns (export dir, the checkpoint's config)."""
    torch.manual_seed(0)
    save_checkpoint(str(root / "out"), 1, DFlashDrafter(cfg).trainable_state_dict(), cfg.to_dict(), {"step": 1},
                    keep=1)
    export_checkpoint(str(root / "out"), target_dir, str(root / "export"))
    _, trained, _ = load_checkpoint(str(root / "out" / "checkpoints" / "step-1"))
    return str(root / "export"), DrafterConfig.from_dict(trained)


def _target(name: str, root) -> str:
    """The tiny qwen3_5 target (dflash-make-tiny --family qwen3_5), or the tiny Qwen3 one with a trained rope."""
    if name == "qwen3_5":
        write_target(str(root / "target"), seed=0, family="qwen3_5")
    else:
        config = qwen3_config()
        config.rope_parameters = dict(TRAINED_ROPES[name])
        config.max_position_embeddings = 2048
        config.save_pretrained(str(root / "target"))
    return str(root / "target")


@pytest.fixture(scope="module", params=["qwen3_5", *TRAINED_ROPES])
def rope_export(request, tmp_path_factory):
    from transformers import AutoConfig
    root = tmp_path_factory.mktemp(f"rope-{request.param}")
    target_dir = _target(request.param, root)
    cfg = DrafterConfig.from_target(AutoConfig.from_pretrained(target_dir), 1, [1, 3, 5], block_size=4,
                                    mask_token_id=511)
    return (request.param, *_export(root, target_dir, cfg))


@pytest.mark.parametrize("engine", sorted(ROPE_ROWS))
def test_engine_rotation_is_the_trained_one(engine, rope_export):
    name, export_dir, trained = rope_export
    assert not rope_errors(engine, export_dir, trained), "\n".join(rope_errors(engine, export_dir, trained))
    if name == "qwen3_5":  # the seed's family: its quarter-rotary is the target's attention, not the drafter's
        assert trained.rope_parameters is None and json.load(open(f"{export_dir}/config.json"))[
            "rope_parameters"] == {"rope_type": "default", "rope_theta": 10_000_000.0}


@pytest.mark.parametrize("rope,declared,engine,field", [
    # what from_target wrote before: the target's quarter rotary (SGLang rotates the whole head)
    ({"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25}, None, "sglang",
     "partial_rotary_factor"),
    # the target's dynamic NTK kept: SGLang's fixed NTK base is neither training's nor vLLM's
    ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, None, "sglang", "rope_type"),
    # a whole-head drafter whose export claimed a quarter: vLLM would rotate a quarter
    (None, {"partial_rotary_factor": 0.25}, "vllm", "partial_rotary_factor"),
    # ... or another scaling than the one trained
    (None, {"rope_type": "linear", "factor": 4.0}, "vllm", "rope_type"),
])
def test_rotation_trained_otherwise_fails_naming_engine_and_field(rope, declared, engine, field, tiny, tmp_path):
    from transformers import AutoConfig
    cfg = DrafterConfig.from_target(AutoConfig.from_pretrained(tiny["target"]), 1, [1, 3, 5], block_size=4,
                                    mask_token_id=511)
    cfg = DrafterConfig.from_dict(cfg.to_dict() | {"rope_parameters": rope})
    export_dir, trained = _export(tmp_path, tiny["target"], cfg)
    if declared:
        config = json.load(open(f"{export_dir}/config.json"))
        config["rope_parameters"].update(declared)
        json.dump(config, open(f"{export_dir}/config.json", "w"))
    errors = rope_errors(engine, export_dir, trained)
    assert len(errors) == 1 and errors[0].startswith(f"{engine}: rope_parameters.{field}:") and ".py:" in errors[0]
