"""proofs/compare_proofs.py on the recorded proofs of trainer/results (run 19: the reference and soft-label temperature
0.5 on one H100, the same prompts): the paired bootstrap's Δ, interval and refusals."""

import copy
import json
import os

import pytest

from proofs import compare_proofs
from proofs.compare_proofs import Mismatch, compare
from proofs.eval_sets import result_key

RESULTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results")
RUN19_A = os.path.join(RESULTS, "proof-smollm2-h100-2026-12-06-run19-a-reference-5min-budget.json")
RUN19_B = os.path.join(RESULTS, "proof-smollm2-h100-2026-12-06-run19-b-soft-label-temperature-0.5.json")
RUN23_A = os.path.join(RESULTS, "proof-smollm2-h100-2026-12-06-run23-a-wsd-gamma-3-anchors-64-10min.json")
RUN24 = os.path.join(RESULTS, "proof-smollm2-h200-2026-12-06-run24-wsd-gamma-3-anchors-64-20min.json")
RUN16 = os.path.join(RESULTS, "proof-smollm2-h200-2026-12-04-run16-5min-budget.json")


def load(path):
    with open(path) as f:
        return json.load(f)


def test_delta_is_the_difference_of_the_recorded_taus_and_lies_in_its_interval():
    a, b = load(RUN19_A), load(RUN19_B)
    rows = compare(a, b, resamples=2000)
    assert [r["set"] for r in rows] == ["split", "other_styles"]
    for r in rows:
        key = result_key("eval", r["set"])
        assert r["delta"] == pytest.approx(b["snapshots"][0][key]["tau"] - a["snapshots"][0][key]["tau"])
        lo, hi = r["interval"]
        assert lo < r["delta"] < hi and hi - lo < 0.5
        assert r["steps"] == [1764, 1774]
    assert rows == compare(a, b, resamples=2000)  # seeded: the same draws each time
    assert rows != compare(a, b, resamples=2000, seed=1)


def test_a_proof_against_itself_differs_by_nothing_and_a_better_lever_on_every_prompt_is_above_zero():
    a = load(RUN19_A)
    same = compare(a, a, resamples=500)
    assert all(r["delta"] == 0 and r["interval"] == [0, 0] and r["share_above_zero"] == 0 for r in same)
    better = copy.deepcopy(a)
    other = better["snapshots"][0]["eval_other_styles"]
    other["prompt_accepted"] = [n + 1 for n in other["prompt_accepted"]]  # one token more accepted on every prompt
    other["tau"] = sum(other["prompt_accepted"]) / sum(other["prompt_steps"])
    rows = {r["set"]: r for r in compare(a, better, resamples=500)}
    assert rows["split"]["delta"] == 0
    assert rows["other_styles"]["interval"][0] > 0 and rows["other_styles"]["share_above_zero"] == 1


def test_other_prompts_older_records_and_a_missing_snapshot_are_refused():
    a, b = load(RUN19_A), load(RUN19_B)
    moved = copy.deepcopy(b)
    moved["baseline"]["prompt_steps"][0] += 1  # another split: prompt lookup took other steps
    with pytest.raises(Mismatch, match="prompt lookup's steps per prompt differ"):
        compare(a, moved)
    with pytest.raises(Mismatch, match="no figures per prompt"):
        compare(load(RUN16), b)
    with pytest.raises(Mismatch, match=r"no snapshot at 10 min \(it has 5\)"):
        compare(a, b, minutes=10)
    unevaluated = dict(b, snapshots=[])
    with pytest.raises(Mismatch, match=r"share no snapshot \(the reference's minutes: \[5.0\], the lever's: none\)"):
        compare(a, unevaluated)


def test_by_default_the_last_snapshot_both_took_is_compared():
    a, b = load(RUN19_A), load(RUN19_B)
    longer = copy.deepcopy(b)
    later = copy.deepcopy(b["snapshots"][0])
    later.update(minutes=10.0, step=3500)
    later["eval"]["prompt_accepted"] = [n + 5 for n in later["eval"]["prompt_accepted"]]
    longer["snapshots"].append(later)  # a 10-minute lever against a 5-minute reference: compared at 5
    rows = compare(a, longer, resamples=500)
    assert [r["minutes"] for r in rows] == [5.0, 5.0] and rows[0]["steps"] == [1764, 1774]
    assert rows == compare(a, b, resamples=500)


def test_a_longer_budget_is_compared_at_its_own_snapshot_and_a_missing_one_names_its_flag(capsys):
    ten, twenty = load(RUN23_A), load(RUN24)  # a 10-minute budget's end against a 20-minute budget's
    rows = compare(ten, twenty, resamples=500, lever_minutes=20)
    assert [(r["minutes"], r["lever_minutes"]) for r in rows] == [(10.0, 20.0)] * 2
    assert rows[0]["steps"] == [6220, 12777]
    ends = {key: twenty["snapshots"][-1][result_key("eval", key)]["tau"] for key in ("split", "other_styles")}
    assert {r["set"]: r["tau_lever"] for r in rows} == ends
    # without it, the last snapshot both took: the 20-minute run's 10-minute one (taken at the peak rate)
    assert [r["steps"] for r in compare(ten, twenty, resamples=500)] == [[6220, 6272]] * 2
    with pytest.raises(Mismatch, match=r"the lever has no snapshot at 15 min \(it has 10, 20\): pass one of those "
                                       r"to --lever-snapshot"):
        compare(ten, twenty, lever_minutes=15)
    assert compare_proofs.main([RUN23_A, RUN24, "--lever-snapshot", "20", "--resamples", "500"]) == 0
    assert "| after 10 / 20 min |" in capsys.readouterr().out


def test_the_command_prints_the_table_or_one_line_naming_the_problem(capsys):
    assert compare_proofs.main([RUN19_A, RUN19_B, "--resamples", "500"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 4 and table[2].startswith("| the proof's split | 32 | 1,764 / 1,774 | 2.72 | 2.81 | +0.09 |")
    assert table[3].startswith("| other styles | 78 |")
    assert compare_proofs.main([RUN16, RUN19_B]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("compare_proofs: the proof's split: the reference has no figures")
    with pytest.raises(SystemExit):
        compare_proofs.main([RUN19_A, RUN19_B, "--resamples", "10"])
    assert "too few for a 95 % interval" in capsys.readouterr().err


RUN25_A = os.path.join(RESULTS, "proof-smollm2-h100-2026-12-06-run25-a-wsd-gamma-3-anchors-64-5min.json")
RUN26_A = os.path.join(RESULTS, "proof-smollm2-h100-2026-12-07-run26-a-wsd-gamma-3-anchors-64-5min.json")
RUN26_B = os.path.join(RESULTS, "proof-smollm2-h100-2026-12-07-run26-b-shard-weights-synth-2-extra-4-5min.json")


def test_the_reference_run_again_sets_the_floor_a_levers_delta_must_clear(capsys):
    ref, lever, again = load(RUN26_A), load(RUN26_B), load(RUN25_A)  # run 25 A: run 26 A's flags, a lease earlier
    rows = compare_proofs.against_replicate(compare(ref, lever, resamples=500), ref, [again], 500, 0)
    assert [(r["set"], bool(r.get("replicate"))) for r in rows] == [
        ("split", False), ("split", True), ("other_styles", False), ("other_styles", True)]
    split, split_again, other, other_again = rows
    assert split_again["steps"] == [2732, 2867] and split_again["delta"] == pytest.approx(
        again["snapshots"][-1]["eval"]["tau"] - ref["snapshots"][-1]["eval"]["tau"])
    # the split: the lever moved nothing, the same flags moved it 0.07; other styles: +0.05 against 0.03
    assert split["beyond_replicate"] is False and other["beyond_replicate"] is True
    assert abs(other["delta"]) > abs(other_again["delta"]) > 0.02
    assert compare_proofs.main([RUN26_A, RUN26_B, "--replicate", RUN25_A, "--resamples", "500"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].endswith("| Δ beyond the reference again |") and len(table) == 6
    assert table[3].startswith("| the proof's split, the reference again | 32 | 2,732 / 2,867 | 3.40 | 3.47 | +0.07 |")
    assert table[2].endswith("| no |") and table[4].endswith("| yes |") and table[5].endswith("| - |")
    assert compare_proofs.main([RUN26_A, RUN26_B, "--replicate", RUN26_A + ".missing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("compare_proofs: cannot read a proof:") and ".missing" in err[0]
    unevaluated = copy.deepcopy(again)
    del unevaluated["snapshots"][-1]["eval_other_styles"]
    with pytest.raises(Mismatch, match="a replicate has no figures for other styles"):
        compare_proofs.against_replicate(compare(ref, lever, resamples=500), ref, [again, unevaluated], 500, 0)


RUN27_A = os.path.join(RESULTS, "proof-smollm2-h100-2026-12-07-run27-a-wsd-gamma-3-anchors-64-5min.json")
RUN27_C = os.path.join(RESULTS, "proof-smollm2-h100-2026-12-07-run27-c-anchors-32-5min.json")


def test_several_replicates_make_the_floor_the_references_spread_over_leases(capsys):
    """Run 27 C (--max-anchors 32) against run 27 A: beyond run 26 A again on both sets, but not beyond run 25 A
    on the split (the same flags a lease earlier read 0.08 higher), so not beyond the spread of both."""
    ref, lever = load(RUN27_A), load(RUN27_C)
    rows = compare(ref, lever, resamples=500)
    one = compare_proofs.against_replicate(rows, ref, [load(RUN26_A)], 500, 0)
    both = compare_proofs.against_replicate(rows, ref, [load(RUN26_A), load(RUN25_A)], 500, 0)
    assert [r["beyond_replicate"] for r in one if not r.get("replicate")] == [True, True]
    assert [(r["set"], bool(r.get("replicate"))) for r in both] == [
        ("split", False), ("split", True), ("split", True),
        ("other_styles", False), ("other_styles", True), ("other_styles", True)]
    split, _, split_25, other, _, _ = both
    assert split["beyond_replicate"] is False and abs(split_25["delta"]) > abs(split["delta"])
    assert other["beyond_replicate"] is True
    assert compare_proofs.main([RUN27_A, RUN27_C, "--replicate", RUN26_A, "--replicate", RUN25_A,
                                "--resamples", "500"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 8 and table[2].endswith("| no |") and table[5].endswith("| yes |")
