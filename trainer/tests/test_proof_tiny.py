"""The proof driver's --tiny path end to end on the CPU: regenerate, dflash-train (a subprocess, with a time
budget and a snapshot), export, reload, τ on both held-out sets (the split and the other-styles set)."""

from __future__ import annotations

import json
import os

import pytest

from trainer_testlib import load_benchmark, read_heartbeat, read_metrics


@pytest.mark.timeout(600)
@pytest.mark.parametrize("labels", [[], ["--use-soft-labels"]], ids=["hard", "soft"])
def test_proof_tiny_drives_dflash_train_and_reports(tmp_path, capfd, labels):
    driver = load_benchmark("proofs.proof_smollm2")
    out = tmp_path / "proof"
    assert driver.main(["--tiny", "--out", str(out), "--time-budget-min", "0.1", "--snapshot-minutes", "0.05",
                        "--device", "cpu", "--report-dir", str(tmp_path / "report")] + labels) == 0
    result = json.load(open(tmp_path / "report" / "proof.json"))
    # the training was dflash-train's, with the driver's flags handed on under their own names
    command = result["train_command"]
    assert command[1:3] == ["-m", "dflash_trainer.cli"] and ("--use-soft-labels" in command) == bool(labels)
    assert "--time-budget-min=0.1" in command and "--snapshot-minutes=0.05" in command
    assert result["train_config"]["use_soft_labels"] == bool(labels) and result["train_config"]["block_size"] == 8
    hb = read_heartbeat(out / "train")
    assert hb["phase"] == "finished" and hb["pid"] != os.getpid()
    log = capfd.readouterr().out
    assert "the time budget of 0.1 min is spent" in log and f"{'soft' if labels else 'hard'} labels" in log
    # its snapshots at 0.05 min and at the end of the budget, each evaluated from its export
    assert [s["minutes"] for s in result["snapshots"]] == [0.05, 0.1]
    assert result["baseline"]["lossless"] and result["baseline_other_styles"]["lossless"]
    assert result["num_other_styles_prompts"] == 4 and result["baseline_other_styles"]["num_prompts"] == 4
    for snap in result["snapshots"]:
        assert snap["step"] >= 1 and snap["eval"]["lossless"] and snap["train_s"] >= snap["minutes"] * 60
        assert 1.0 <= snap["eval"]["tau"] <= result["block_size"]
        other = snap["eval_other_styles"]  # the same export on the other-styles prompts, through dflash-eval's code
        assert other["lossless"] and other["num_prompts"] == 4 and 1.0 <= other["tau"] <= result["block_size"]
        assert os.path.isfile(os.path.join(snap["export"], "config.json"))
        assert snap["checkpoint"] == str(out / "train" / "snapshots" / f"{snap['minutes']:g}min")
    assert result["snapshots"][-1]["step"] == read_metrics(out / "train")[-1]["step"]
    assert result["curve"] and result["curve"][-1]["step"] == result["snapshots"][-1]["step"]
    table = open(tmp_path / "report" / "proof.md").read()
    assert "| DFlash | 0.1 |" in table and "prompt lookup" in table and "trained by dflash-train" in table
    # both τ side by side in the table: the split's, then the other styles'
    assert "| τ | τ other styles |" in table
    last = result["snapshots"][-1]
    assert f"| {last['eval']['tau']:.2f} | {last['eval_other_styles']['tau']:.2f} |" in table
    # the other-styles set was kept out of the training data (the check ran: nothing of it in the tiny chats)
    assert result["data"]["bad"].get("held_out", 0) == 0 and result["other_styles"].endswith("other_styles.jsonl")
