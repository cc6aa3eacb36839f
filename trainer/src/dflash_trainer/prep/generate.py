"""Batched sampling from the target for dflash-prepare-data --regenerate: vLLM when importable (and --engine
allows), else transformers generate (batched, left padding).

`cache` picks transformers' KV cache: "dynamic" (grows by concatenation every step), "static" (allocated once for
the batch, eager) or "static-compiled" (the same, with transformers' own compilation of the decoding step on
CUDA). `attention` picks the attention: transformers' "sdpa", or "packed-gqa" (prep/packed_gqa.py: one new token
attends to the KV cache without copying it per query head). benchmarks/regeneration.py times them on the GPU before
any becomes a default."""

from __future__ import annotations

import inspect
import json
import os


def eos_ids_of(model_dir: str, tokenizer) -> set[int]:
    ids = set()
    path = os.path.join(model_dir, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            eos = json.load(f).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


CACHES = ("dynamic", "static", "static-compiled")
ATTENTIONS = ("sdpa", "packed-gqa")
# The decoding options as flags, declared once (Generator's parameter, the flag's name, its choices, help): every
# command that regenerates or synthesizes takes them (the proof with --regen- in front). They change how fast the
# answers come, not which rows a preparation holds, so they are not part of its resume fingerprint.
DECODING_FLAGS = (
    ("cache", "kv-cache", CACHES, "transformers' KV cache while generating"),
    ("attention", "decode-attention", ATTENTIONS, "attention of each new token over the cache (packed-gqa: without "
                                                  "copying the cache per query head)"),
)


class Generator:
    """Batched sampling from the target: vLLM when importable (and --engine allows), else transformers."""

    def __init__(self, model_dir: str, tokenizer, engine: str, device: str, temperature: float,
                 max_new_tokens: int, batch_size: int, seed: int, cache: str = "dynamic",
                 attention: str = "packed-gqa"):
        import torch
        if cache not in CACHES:
            raise ValueError(f"unknown KV cache {cache!r}; choose one of {', '.join(CACHES)}")
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTIONS)}")
        self.cache, self.attention = cache, attention
        self.tokenizer, self.temperature, self.max_new_tokens = tokenizer, temperature, max_new_tokens
        self.batch_size, self.seed = batch_size, seed
        self.eos = eos_ids_of(model_dir, tokenizer)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos or {0})
        self.vllm = None
        if engine in ("auto", "vllm"):
            try:
                import vllm  # noqa: F401
                if {"cache": cache, "attention": attention} != decoding_defaults():
                    raise ValueError("--kv-cache and --decode-attention choose transformers' decoding, and vllm is "
                                     "importable: add --engine transformers, or leave them at their defaults")
                self.vllm = vllm.LLM(model=model_dir, seed=seed)
            except ImportError:
                if engine == "vllm":
                    raise ValueError("--engine vllm but vllm is not importable; pip install vllm or use "
                                     "--engine transformers") from None
        self.engine = "vllm" if self.vllm is not None else "transformers"
        if self.vllm is None:
            from transformers import AutoModelForCausalLM

            from dflash_trainer.eval.decode_attention import use_plan_free_attention
            from dflash_trainer.prep import packed_gqa
            self.device = torch.device(device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
            use_plan_free_attention(self.device)  # generate's padded batches change shape every step
            implementation = {} if attention == "sdpa" else {"attn_implementation": packed_gqa.register()}
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **implementation)
            self.model = self.model.to(self.device).eval()

    def describe(self) -> str:
        """The engine and, for transformers, its decoding options (for a log line)."""
        return self.engine if self.vllm is not None else f"{self.engine}, KV cache {self.cache}, attention " \
            f"{self.attention}"

    def generate(self, prompts: list[list[int]], max_new: list[int], chunk_seed: int) -> list[list[int]]:
        """Generated ids per prompt, cut after the first EOS (EOS kept)."""
        if self.vllm is not None:  # not exercised by the tests (no vllm here)
            from vllm import SamplingParams
            params = [SamplingParams(temperature=self.temperature, max_tokens=m, seed=chunk_seed + i)
                      for i, m in enumerate(max_new)]
            outs = self.vllm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            return [self._cut(list(o.outputs[0].token_ids), m) for o, m in zip(outs, max_new)]
        import torch
        torch.manual_seed(chunk_seed)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths, less padding
        result: list[list[int] | None] = [None] * len(prompts)
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            width = max(len(prompts[i]) for i in idx)
            ids = torch.full((len(idx), width), self.pad, dtype=torch.long)
            att = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):  # left padding: every prompt ends where generation starts
                ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
                att[row, width - len(prompts[i]):] = 1
            limit = max(max_new[i] for i in idx)
            # pure temperature sampling (no top-k/top-p cut); greedy when --temperature 0
            generation = dict(do_sample=True, temperature=self.temperature, top_p=1.0, top_k=0) \
                if self.temperature > 0 else dict(do_sample=False)
            if self.cache != "dynamic":  # (the attention was set on the model when it loaded)
                generation.update(cache_implementation="static", disable_compile=self.cache == "static")
            with torch.no_grad():
                out = self.model.generate(input_ids=ids.to(self.device), attention_mask=att.to(self.device),
                                          max_new_tokens=limit, min_new_tokens=0, eos_token_id=sorted(self.eos) or None,
                                          pad_token_id=self.pad, **generation)
            for row, i in enumerate(idx):
                result[i] = self._cut(out[row, width:].tolist(), max_new[i])
        return result

    def _cut(self, gen: list[int], limit: int) -> list[int]:
        gen = gen[:limit]
        for j, tok in enumerate(gen):
            if tok in self.eos:
                return gen[:j + 1]
        return gen


def decoding_defaults() -> dict:
    """Generator's decoding defaults: each declared once, in its signature."""
    params = inspect.signature(Generator.__init__).parameters
    return {name: params[name].default for name, _, _, _ in DECODING_FLAGS}


def add_decoding_flags(p, prefix: str = "") -> None:
    """DECODING_FLAGS on parser `p` (argparse), with Generator's defaults; `prefix` goes before each flag's name."""
    d = decoding_defaults()
    for name, flag, choices, text in DECODING_FLAGS:
        p.add_argument(f"--{prefix}{flag}", choices=choices, default=d[name], help=f"{text} (default %(default)s)")


def decoding_of(args, prefix: str = "") -> dict:
    """Generator's decoding keywords from args parsed by add_decoding_flags with this prefix."""
    return {name: getattr(args, f"{prefix}{flag}".replace("-", "_")) for name, flag, _, _ in DECODING_FLAGS}
