"""A tiny offline word-level tokenizer with a ChatML chat template, for the tiny Qwen3 target (tests, --tiny demo).

Ids stay below the tiny target's vocabulary (512) and never use its <|MASK|> (511). Built with the
`tokenizers` library and saved with PreTrainedTokenizerFast.save_pretrained next to the target's weights,
so `AutoTokenizer.from_pretrained(target_dir)` works like for a real model.
"""

from __future__ import annotations

import random

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"]
WORDS = ("system user assistant you are a helpful tiny model please count from to and then stop the "
         "one two three four five six seven eight nine ten eleven twelve red green blue cat dog bird "
         "say list colors animals numbers repeat after me again hello hi yes no ok . , ? !").split()
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Punctuation()])
    tok.add_special_tokens(SPECIALS[:3])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token="<|im_start|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(target_dir: str):
    """Writes the tokenizer into target_dir and sets the target's eos id to <|im_end|>."""
    import json
    import os

    tok = build_tokenizer()
    tok.save_pretrained(target_dir)
    gen_path = os.path.join(target_dir, "generation_config.json")
    gen = {}
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            gen = json.load(f)
    gen.update({"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id})
    with open(gen_path, "w") as f:
        json.dump(gen, f, indent=2)
    return tok


def synthetic_chats(num: int, seed: int = 0) -> list[dict]:
    """Chat rows whose answers follow simple rules (count, repeat, list), in the JSONL shape prepare-data reads."""
    rng = random.Random(seed)
    numbers = WORDS[WORDS.index("one"):WORDS.index("twelve") + 1]
    rows = []
    for _ in range(num):
        kind = rng.randrange(3)
        if kind == 0:
            a = rng.randrange(len(numbers) - 3)
            b = rng.randrange(a + 2, len(numbers))
            q, ans = f"please count from {numbers[a]} to {numbers[b]}", " ".join(numbers[a:b + 1]) + " ."
        elif kind == 1:
            words = rng.sample(["red", "green", "blue", "cat", "dog", "bird", "hello"], 3)
            q, ans = "repeat after me " + " ".join(words), " ".join(words * 3) + " ."
        else:
            what = rng.choice(["colors", "animals", "numbers"])
            items = {"colors": ["red", "green", "blue"], "animals": ["cat", "dog", "bird"],
                     "numbers": numbers[:5]}[what]
            q, ans = f"list {what}", " , ".join(items) + " ."
        rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": ans}]})
    return rows
