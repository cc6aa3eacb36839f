"""dflash-export: a checkpoint -> a directory SGLang (--speculative-algorithm DFLASH) and vLLM
("method": "dflash") load as a DFlash draft (z-lab format, docs/dflash.md "Export").

    dflash-export --checkpoint OUTPUT_DIR/checkpoints/step-N --target-model TARGET_DIR --out EXPORT_DIR

--checkpoint may also be an --output-dir (its `latest` is used). The export holds config.json,
model.safetensors with keys without prefix and without embed_tokens/lm_head (the engine borrows the
target's), and modeling_dflash.py + drafter.py for AutoModel.from_pretrained(..., trust_remote_code=True).
load_exported_drafter() rebuilds the drafter from such a directory (tests, evaluation).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

from dflash_trainer.loop.checkpoint import find_latest, load_checkpoint
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.model import modeling_dflash
from dflash_trainer.model.modeling_dflash import drafter_config_from_export

# Fields copied from the target when present, so engines see the target's conventions. Never its rope scaling:
# the drafter's own rope_parameters (what it trained with) are written instead.
_COPIED_TARGET_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "initializer_range")
# Files beside the weights that make the export load with transformers alone (trust_remote_code).
MODELING_FILES = ("modeling_dflash.py", "drafter.py")
AUTO_MAP = {"AutoModel": "modeling_dflash.DFlashDraftModel"}


def export_config(cfg: DrafterConfig, target_config: dict, dtype: str, mask_token: str | None = None) -> dict:
    """config.json: every field SGLang and vLLM read (tests/test_engine_conformance.py cites where)."""
    text = target_config.get("text_config", target_config)
    L = cfg.num_hidden_layers
    rope = dict(cfg.rope_parameters or {"rope_type": "default"})
    rope.setdefault("rope_theta", cfg.rope_theta)
    dflash = {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids),
              "block_size": cfg.block_size}
    if mask_token is not None:
        dflash["mask_token"] = mask_token
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "auto_map": dict(AUTO_MAP),
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": L,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope,
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
        "dtype": dtype,
        "torch_dtype": dtype,
        "num_target_layers": cfg.num_target_layers,
        "block_size": cfg.block_size,
        "dflash_config": dflash,
        # vLLM's convention: the aux hidden state of layer i is captured at its input, i.e. after layer i - 1,
        # so the output of target layer id is aux id + 1 (vLLM derives the same from dflash_config when this
        # is absent; older versions read only this and sized fc from num_hidden_layers without it).
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
    }
    if rope.get("rope_type") != "default":  # transformers-4-era readers look for the scaling here
        config["rope_scaling"] = rope
    if "partial_rotary_factor" in rope:
        config["partial_rotary_factor"] = rope["partial_rotary_factor"]
    for key in _COPIED_TARGET_FIELDS:
        if key in text and text[key] is not None:
            config[key] = text[key]
    return config


def mask_token_string(target_model: str, mask_token_id: int) -> str | None:
    """The token string of mask_token_id in the target's tokenizer files (SGLang checks the id against it)."""
    added = os.path.join(target_model, "added_tokens.json")
    if os.path.isfile(added):
        with open(added) as f:
            for text, token_id in json.load(f).items():
                if int(token_id) == mask_token_id:
                    return text
    for name, key in (("tokenizer.json", "added_tokens"), ("tokenizer_config.json", "added_tokens_decoder")):
        path = os.path.join(target_model, name)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            entries = json.load(f).get(key) or []
        if isinstance(entries, dict):  # tokenizer_config: {"id": {"content": ...}}
            entries = [dict(v, id=int(k)) for k, v in entries.items()]
        for entry in entries:
            if int(entry.get("id", -1)) == mask_token_id and entry.get("content"):
                return entry["content"]
    return None


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
    mask_token = mask_token_string(target_model, cfg.mask_token_id)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(export_config(cfg, target_config, dtype, mask_token), f, indent=2)
    here = os.path.dirname(os.path.abspath(modeling_dflash.__file__))  # drafter.py beside it
    for name in MODELING_FILES:
        shutil.copyfile(os.path.join(here, name), os.path.join(out_dir, name))
    return path


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
    p.add_argument("--wandb-artifact", metavar="RUN_DIR", default=None,
                   help="also log the export as a model artifact of the W&B run of the training run in RUN_DIR "
                        "(WANDB_PROJECT; dflash_trainer[wandb])")
    args = p.parse_args(argv)
    try:
        if not os.path.isfile(os.path.join(args.target_model, "config.json")):
            raise ValueError(f"--target-model {args.target_model} has no config.json; pass the target's directory")
        used = export_checkpoint(args.checkpoint, args.target_model, args.out, args.dtype)
    except (ValueError, OSError) as e:
        print(f"dflash-export: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"exported {used} -> {args.out}")
    if args.wandb_artifact:
        from dflash_trainer.telemetry.wandb_log import log_export_artifact
        try:
            log_export_artifact(args.wandb_artifact, args.out, used, print)
        except (ValueError, ImportError) as e:
            print(f"dflash-export: error: the export is written, but not logged to W&B: {e}", file=sys.stderr)
            return 2
    with open(os.path.join(args.out, "config.json")) as f:
        factor = json.load(f)["rope_parameters"].get("partial_rotary_factor")
    if factor is not None and factor < 1.0:
        print(f"dflash-export: note: this checkpoint was trained rotating {factor} of each head (before the drafter "
              "rotated its whole head); vLLM serves it so, SGLang's DFlash model rotates the whole head: retrain "
              "it with this version for SGLang", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
