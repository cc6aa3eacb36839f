"""The proof's baseline (the target's greedy references, target-only and prompt-lookup figures on both held-out
sets) does not depend on the drafter: a proof keeps it under its data root (`<data root>/baseline-cache/<key>.json`)
and a later proof on the same data root reuses it instead of decoding it again (about 220 s of the GPU in four
processes for SmolLM2, beside the compile warm-up or training; PROOF.md runs 15 and 16), so back-to-back ablations
train alike. The key covers everything the baseline's tokens and figures depend on: the target's files, every
prompt's token ids, the block size, the new-token cap, the n-gram, the dtype, and the device kind with the torch
and transformers versions (the references are compared token for token with each snapshot's decode, so they must
come from the same numerics).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os

import torch

from dflash_trainer.telemetry.heartbeat import write_json_atomic


def device_kind(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _target_digest(target_dir: str) -> str:
    h = hashlib.sha256()
    paths = [os.path.join(target_dir, "config.json"), *sorted(glob.glob(os.path.join(target_dir, "*.safetensors")))]
    for path in paths:
        h.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    return h.hexdigest()


def baseline_key(target_dir: str, prompts: dict[str, list[list[int]]], block_size: int, max_new_tokens: int,
                 ngram: int, dtype: str, device: torch.device) -> tuple[str, dict]:
    """(the key, the readable settings it covers)."""
    import transformers
    about = {"target_sha256": _target_digest(target_dir), "block_size": block_size,
             "max_new_tokens": max_new_tokens, "ngram": ngram, "dtype": dtype, "device": device_kind(device),
             "torch": torch.__version__, "transformers": transformers.__version__,
             "num_prompts": {name: len(p) for name, p in prompts.items()}}
    h = hashlib.sha256(json.dumps(about, sort_keys=True).encode())
    h.update(json.dumps(prompts, sort_keys=True).encode())
    return h.hexdigest()[:24], about


def lookup_replayed(baseline: dict) -> bool:
    """Whether a baseline's prompt-lookup figures were replayed (a proof with --eval-replay kept it), not decoded:
    a proof that decodes decodes them again (and keeps the decoded baseline, which serves both kinds of proof)."""
    return any(s["prompt_lookup"].get("replayed") for s in baseline["sets"].values())


def load(cache_dir: str, key: str) -> dict | None:
    try:
        with open(os.path.join(cache_dir, f"{key}.json")) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record["baseline"] if record.get("key") == key else None


def store(cache_dir: str, key: str, about: dict, baseline: dict) -> str:
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"{key}.json")
    write_json_atomic(path, {"key": key, "settings": about, "baseline": baseline})
    return path
