"""dflash-make-tiny: a tiny random Qwen3 target and a tiny learnable tokenized dataset (tests, demo).

Target: Qwen3 with vocab 512, hidden 64, 8 layers (default taps for K=5: 1,2,3,4,5),
saved with save_pretrained (safetensors) plus added_tokens.json naming `<|MASK|>` = 511, so
dflash-train finds the mask token without a flag. No tokenizer: the data is already token ids.

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


def write_target(target_dir: str, seed: int, num_layers: int = 8, hidden: int = 64):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=hidden // 4, max_position_embeddings=2048, tie_word_embeddings=False,
                         # HF's default 0.02 makes the random lm_head's logits nearly flat (std ~0.16), so a
                         # drafter borrowing it learns very slowly; 0.4 gives logits a usable range.
                         initializer_range=0.4)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(target_dir, safe_serialization=True)
    with open(os.path.join(target_dir, "added_tokens.json"), "w") as f:
        json.dump({"<|MASK|>": MASK_ID}, f)
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
    args = p.parse_args(argv)
    if args.num_sequences < 2:
        print("dflash-make-tiny: error: --num-sequences must be at least 2", file=sys.stderr)
        return 2
    write_target(args.target_dir, args.seed, args.num_layers, args.hidden)
    paths = write_dataset(args.data_dir, args.num_sequences, args.seed)
    print(f"target: {args.target_dir} (Qwen3, vocab {VOCAB}, hidden {args.hidden}, {args.num_layers} layers, "
          f"<|MASK|> = {MASK_ID})")
    print(f"data: {len(paths)} shards, {args.num_sequences} sequences in {args.data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
