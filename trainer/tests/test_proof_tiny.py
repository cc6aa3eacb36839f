"""The proof driver's --tiny path end to end on the CPU (regenerate, timed training, export, reload, τ)."""

from __future__ import annotations

import json
import os

import pytest

from trainer_testlib import load_benchmark


@pytest.mark.timeout(180)
@pytest.mark.parametrize("labels", [[], ["--soft-labels"]], ids=["hard", "soft"])
def test_proof_tiny_runs_and_reports(tmp_path, labels):
    driver = load_benchmark("proof_smollm2")
    out = tmp_path / "proof"
    assert driver.main(["--tiny", "--out", str(out), "--minutes", "0.05,0.1", "--device", "cpu",
                        "--report-dir", str(tmp_path / "report")] + labels) == 0
    result = json.load(open(tmp_path / "report" / "proof.json"))
    assert result["args"]["soft_labels"] == bool(labels)
    assert [s["minutes"] for s in result["snapshots"]] == [0.05, 0.1]
    assert result["baseline"]["lossless"]
    for snap in result["snapshots"]:
        assert snap["step"] >= 1 and snap["eval"]["lossless"]
        assert 1.0 <= snap["eval"]["tau"] <= result["block_size"]
        assert os.path.isfile(os.path.join(snap["export"], "config.json"))
    table = open(tmp_path / "report" / "proof.md").read()
    assert "| DFlash | 0.1 |" in table and "prompt lookup" in table
