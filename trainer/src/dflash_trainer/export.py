"""dflash-export: a checkpoint -> a directory SGLang (--speculative-algorithm DFLASH) and vLLM
("method": "dflash") load as a DFlash draft (z-lab format, DFLASH.md "Export").

    dflash-export --checkpoint OUTPUT_DIR/checkpoints/step-N --target-model TARGET_DIR --out EXPORT_DIR

--checkpoint may also be an --output-dir (its `latest` is used). The export holds config.json and
model.safetensors with keys without prefix and without embed_tokens/lm_head (the engine borrows the
target's). load_exported_drafter() rebuilds the drafter from such a directory (tests, evaluation).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

from dflash_trainer.checkpoint import find_latest, load_checkpoint
from dflash_trainer.drafter import DFlashDrafter, DrafterConfig

# Qwen3 fields copied from the target when present, so engines see the target's conventions.
_COPIED_TARGET_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "rope_scaling", "initializer_range")


def export_config(cfg: DrafterConfig, target_config: dict, dtype: str) -> dict:
    text = target_config.get("text_config", target_config)
    L = cfg.num_hidden_layers
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": L,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": L,
        "layer_types": ["full_attention"] * L,
        "use_cache": True,
        "torch_dtype": dtype,
        "num_target_layers": cfg.num_target_layers,
        "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids),
                          "block_size": cfg.block_size},
    }
    for key in _COPIED_TARGET_FIELDS:
        if key in text and text[key] is not None:
            config[key] = text[key]
    return config


def export_checkpoint(checkpoint: str, target_model: str, out_dir: str, dtype: str = "bfloat16") -> str:
    path = checkpoint
    if not os.path.isfile(os.path.join(path, "model.safetensors")):
        path = find_latest(checkpoint)
        if path is None:
            raise ValueError(f"--checkpoint {checkpoint} is neither a step-N checkpoint nor an output dir with "
                             "checkpoints/latest; pass one of those")
    model_state, cfg_dict, _ = load_checkpoint(path)
    cfg = DrafterConfig.from_dict(cfg_dict)
    with open(os.path.join(target_model, "config.json")) as f:
        target_config = json.load(f)
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[dtype]
    os.makedirs(out_dir, exist_ok=True)
    tensors = {k: v.to(torch_dtype).contiguous() for k, v in model_state.items()}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(export_config(cfg, target_config, dtype), f, indent=2)
    return path


def drafter_config_from_export(config: dict) -> DrafterConfig:
    d = config["dflash_config"]
    return DrafterConfig(
        hidden_size=config["hidden_size"], num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"], num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"], intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"], target_layer_ids=list(d["target_layer_ids"]),
        num_target_layers=config["num_target_layers"], block_size=d["block_size"],
        mask_token_id=d["mask_token_id"], rms_norm_eps=config["rms_norm_eps"], rope_theta=config["rope_theta"],
        max_position_embeddings=config["max_position_embeddings"])


def load_exported_drafter(export_dir: str, target_model: str | None = None, device="cpu",
                          dtype: torch.dtype = torch.float32) -> DFlashDrafter:
    """Rebuild the drafter from an export dir; embed_tokens/lm_head come from the target when given."""
    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = drafter_config_from_export(json.load(f))
    drafter = DFlashDrafter(cfg)
    drafter.load_trainable_state_dict({k: v.to(dtype) for k, v in load_file(os.path.join(export_dir,
                                                                                       "model.safetensors")).items()})
    if target_model is not None:
        from transformers import AutoModelForCausalLM
        target = AutoModelForCausalLM.from_pretrained(target_model, dtype=dtype)
        drafter.load_frozen(target.get_input_embeddings().weight, target.get_output_embeddings().weight)
        del target
    return drafter.to(device=device, dtype=dtype).eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dflash-export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a checkpoints/step-N dir, or an --output-dir (uses latest)")
    p.add_argument("--target-model", required=True, help="the target model dir the drafter was trained against")
    p.add_argument("--out", required=True, help="export directory (config.json + model.safetensors)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = p.parse_args(argv)
    try:
        if not os.path.isfile(os.path.join(args.target_model, "config.json")):
            raise ValueError(f"--target-model {args.target_model} has no config.json; pass the target's directory")
        used = export_checkpoint(args.checkpoint, args.target_model, args.out, args.dtype)
    except (ValueError, OSError) as e:
        print(f"dflash-export: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"exported {used} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
