"""benchmarks/seed_layout.py on the CPU: its cpu-8 preset with small splits (gloo), dflash-train under torchrun."""

import json

import pytest

from trainer_testlib import load_benchmark


@pytest.mark.timeout(150)
def test_cpu_preset_reports_each_stage_the_queue_and_the_sweep_and_every_rank_took_part(tmp_path, capsys):
    seed_layout = load_benchmark("benchmarks.seed_layout")
    out = tmp_path / "seed.json"
    assert seed_layout.main(["--preset", "cpu-8", "--splits", "2:2,1:1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["target"]["layers"].count("full_attention") == 2 and len(result["target"]["layers"]) == 8
    assert result["peak"]["tflops"] > 0 and result["flop_per_token"]["target"] > 0
    assert [j["split"] for j in result["jobs"]] == ["2:2", "1:1"]
    for job in result["jobs"]:
        t, d = job["target_ranks"], job["drafter_ranks"]
        # every rank of the job took part: its role, and every micro-batch made was trained on
        assert sorted(job["ranks"], key=int) == [str(r) for r in range(t + d)]
        assert [job["ranks"][str(r)]["role"] for r in range(t + d)] == ["target"] * t + ["drafter"] * d
        assert all(v["tokens"] > 0 for v in job["ranks"].values())
        made = sum(v["tokens"] for v in job["ranks"].values() if v["role"] == "target")
        assert made == sum(v["tokens"] for v in job["ranks"].values() if v["role"] == "drafter")
        for key in ("target_tokens_per_s", "drafter_tokens_per_s", "end_to_end_tokens_per_s",
                    "end_to_end_over_slower"):
            assert job[key] > 0, key
        assert set(job["tflops"]) == {"target stage", "drafter stage", "end to end"}
        # the CPU has neither flash-linear-attention nor causal-conv1d: both fallbacks are named
        assert any("chunk_gated_delta_rule" in line for line in job["kernel_fallbacks"]), job["kernel_fallbacks"]
        assert job["slower_stage"] in ("target", "drafter")
        assert 0 <= job["drafter_wait_share"] <= 1 and 0 <= job["target_wait_share"] <= 1
        assert [q["step"] for q in job["queue_over_time"]] == list(range(1, result["steps"] + 1))
        assert all(len(q["depth"]) == d and max(q["depth"].values()) <= 4 for q in job["queue_over_time"])
    assert result["best_split"] in ("2:2", "1:1")
    assert "best split:" in printed and "queue depth per drafter rank" in printed


def test_bad_splits_are_refused_in_one_line(capsys):
    assert load_benchmark("benchmarks.seed_layout").main(["--preset", "cpu-8", "--splits", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--splits '5': give target:drafter rank counts" in err
