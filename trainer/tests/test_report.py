"""dflash-report on a proof's training run: the τ-vs-minutes chart and the acceptance histogram come from the
proof's proof.json beside the run dir (here the recorded H200 proof of trainer/results, run 10); the run's own
charts from its metrics rows. The page from a real CPU run, opened in Chromium: tests/integration/test_watch_run_local.py."""

import json
import os
import re
import shutil

import pytest

from dflash_trainer.report import cli

RESULT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results",
                      "proof-smollm2-h200-2026-12-02-run10-one-loop.json")


def test_a_proofs_run_gets_its_tau_chart_and_histogram(tmp_path):
    pytest.importorskip("matplotlib")
    train = tmp_path / "train"
    train.mkdir()
    shutil.copy(RESULT, tmp_path / "proof.json")
    with open(train / "metrics.jsonl", "w") as f:
        for i, row in enumerate(json.load(open(RESULT))["curve"][:20]):
            f.write(json.dumps({"step": row["step"], "loss": row["loss"], "tau_proxy": row["tau_proxy"],
                                "slot_acc": [0.0, row["acc1"]], "tokens_per_s": 1000.0, "time": 1000.0 + 10 * i})
                    + "\n")
    assert cli.main([str(train)]) == 0
    page = (train / "report.html").read_text()
    shown = re.findall(r"<figure id='([\w-]+)'><figcaption>[^<]*</figcaption><img class='chart'", page)
    assert shown == ["loss", "accuracy", "tau-proxy", "tokens-per-s", "proof-tau", "proof-histogram"]


def test_a_run_dir_without_metrics_is_refused_in_one_line(tmp_path, capsys):
    assert cli.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert not os.path.exists(tmp_path / "report.html")
