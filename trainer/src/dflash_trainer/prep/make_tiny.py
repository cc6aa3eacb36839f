"""dflash-make-tiny: a tiny random Qwen3 target and a tiny learnable tokenized dataset (tests, demo).

Target: Qwen3 with vocab 512, hidden 64, 8 layers (default taps for K=5: 1,2,3,4,5),
saved with save_pretrained (safetensors) plus added_tokens.json naming `<|MASK|>` = 511, so
dflash-train finds the mask token without a flag. No tokenizer: the data is already token ids.
`--family qwen3_5`: the seed target's family instead (Qwen3.5/3.6: Gated DeltaNet linear-attention layers with
every 4th layer full attention), saved as the 27B checkpoints are (see qwen3_5_config).

Data: each sequence is a "prompt" of random ids in [2, 256) (loss_mask 0) followed by an "answer"
(loss_mask 1) that counts through [256, 304) with stride d = 1 + prompt[0] % 3, wrapping around.
Slot k of a block at anchor a must predict x_a + k*d: the drafter sees x_a in its own block and can
read d from the context features, so the loss falls quickly and per-slot accuracy climbs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

VOCAB = 512
MASK_ID = 511
ANSWER_BASE, ANSWER_RANGE = 256, 48


def make_sequences(num_sequences: int, seed: int, min_len: int = 48, max_len: int = 240):
    import random
    rng = random.Random(seed)
    rows = []
    for _ in range(num_sequences):
        prompt = [rng.randrange(2, ANSWER_BASE) for _ in range(rng.randint(8, 32))]
        stride = 1 + prompt[0] % 3
        start = rng.randrange(ANSWER_RANGE)
        n_answer = rng.randint(max(2, min_len - len(prompt)), max_len - len(prompt))
        answer = [ANSWER_BASE + (start + i * stride) % ANSWER_RANGE for i in range(n_answer)]
        rows.append((prompt + answer, [0] * len(prompt) + [1] * n_answer))
    return rows


def write_dataset(data_dir: str, num_sequences: int, seed: int, num_shards: int = 2) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(data_dir, exist_ok=True)
    rows = make_sequences(num_sequences, seed)
    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8()))])
    paths = []
    for shard in range(num_shards):
        part = rows[shard::num_shards]
        table = pa.table({"input_ids": [r[0] for r in part], "loss_mask": [r[1] for r in part]}, schema=schema)
        path = os.path.join(data_dir, f"shard-{shard:05d}.parquet")
        pq.write_table(table, path)
        paths.append(path)
    return paths


FAMILIES = ("qwen3", "qwen3_5")
# HF's default 0.02 makes a random lm_head's logits nearly flat (std ~0.16), so a drafter borrowing it learns
# very slowly; 0.4 gives logits a usable range.
TINY_INIT_RANGE = 0.4


def qwen3_config(num_layers: int = 8, hidden: int = 64):
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=hidden // 4, max_position_embeddings=2048, tie_word_embeddings=False,
                       initializer_range=TINY_INIT_RANGE)


def qwen3_5_config(num_layers: int = 8, hidden: int = 64, vocab: int = VOCAB, heads: int = 4, kv_heads: int = 2,
                   head_dim: int | None = None, intermediate: int | None = None, linear_key_heads: int = 2,
                   linear_value_heads: int = 4, linear_head_dim: int = 16, max_positions: int = 2048,
                   initializer_range: float = TINY_INIT_RANGE):
    """The seed target's family as its 27B checkpoints are saved (Qwen3.5-27B, Qwen3.6-27B): `Qwen3_5Config`
    (model_type qwen3_5, architectures Qwen3_5ForConditionalGeneration) nesting a `text_config`
    (Qwen3_5TextConfig) beside a vision tower, weights under model.language_model.*. The text layers are Gated
    DeltaNet (`linear_attention`) with every 4th full attention (transformers' full_attention_interval 4: layers
    3, 7, ...; the 27B: 48 + 16 of 64), a quarter-rotary head. AutoModelForCausalLM loads the text part as
    Qwen3_5ForCausalLM (the vision weights are skipped). The vision tower here is the smallest one: dflash-train
    never runs it. Defaults: tiny; the 27B's shape is hidden 5120, 64 layers, 24 heads x 256, 4 KV heads, MLP
    17408, linear heads 16 key / 48 value x 128, vocab 248,320, max positions 262,144."""
    from transformers import Qwen3_5Config
    text = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
                num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                head_dim=head_dim or hidden // heads, linear_num_key_heads=linear_key_heads,
                linear_num_value_heads=linear_value_heads, linear_key_head_dim=linear_head_dim,
                linear_value_head_dim=linear_head_dim, max_position_embeddings=max_positions,
                tie_word_embeddings=False, initializer_range=initializer_range,
                rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden)
    return Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)


def write_target(target_dir: str, seed: int, num_layers: int = 8, hidden: int = 64, family: str = "qwen3",
                 config=None, device: str = "cpu"):
    """A random target of `family` (tiny), or of `config` (a qwen3_config/qwen3_5_config result), built on
    `device` (bf16 on CUDA, fp32 on the CPU) and saved with save_pretrained. Returns the model."""
    import torch
    from transformers import Qwen3_5ForConditionalGeneration, Qwen3ForCausalLM

    if config is None:
        if family not in FAMILIES:
            raise ValueError(f"unknown target family {family!r}; choose one of {', '.join(FAMILIES)}")
        config = (qwen3_config if family == "qwen3" else qwen3_5_config)(num_layers=num_layers, hidden=hidden)
    model_class = Qwen3_5ForConditionalGeneration if config.model_type == "qwen3_5" else Qwen3ForCausalLM
    torch.manual_seed(seed)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_class(config)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(target_dir, safe_serialization=True)
    with open(os.path.join(target_dir, "added_tokens.json"), "w") as f:
        json.dump({"<|MASK|>": config.get_text_config().vocab_size - 1}, f)
    return model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dflash-make-tiny", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target-dir", required=True, help="where the tiny Qwen3 target is saved")
    p.add_argument("--data-dir", required=True, help="where the parquet shards are written")
    p.add_argument("--num-sequences", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-layers", type=int, default=8, help="target layers")
    p.add_argument("--hidden", type=int, default=64, help="target hidden size")
    p.add_argument("--family", choices=FAMILIES, default="qwen3",
                   help="qwen3: Qwen3ForCausalLM; qwen3_5: the seed target's hybrid linear/full-attention family")
    args = p.parse_args(argv)
    if args.num_sequences < 2:
        print("dflash-make-tiny: error: --num-sequences must be at least 2", file=sys.stderr)
        return 2
    model = write_target(args.target_dir, args.seed, args.num_layers, args.hidden, args.family)
    paths = write_dataset(args.data_dir, args.num_sequences, args.seed)
    layers = getattr(model.config.get_text_config(), "layer_types", None)
    print(f"target: {args.target_dir} ({type(model).__name__}, vocab {VOCAB}, hidden {args.hidden}, {args.num_layers} layers, "
          f"<|MASK|> = {MASK_ID}{', layers ' + ','.join(t.split('_')[0] for t in layers) if layers else ''})")
    print(f"data: {len(paths)} shards, {args.num_sequences} sequences in {args.data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
