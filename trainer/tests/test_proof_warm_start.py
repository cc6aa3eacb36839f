"""--init-drafter through the proof driver: a proof that starts from an earlier run's export (or checkpoint) — the
way a drafter's training can go on in a later session — and refuses weights of another drafter shape before it
writes anything (dflash-train's own check, run by the driver up front)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from trainer_testlib import load_benchmark
from dflash_trainer.loop import train


@pytest.mark.timeout(600)
def test_warm_start_continues_from_the_export_and_refuses_another_shape(tmp_path, capsys):
    driver = load_benchmark("proofs.proof_smollm2")
    first = tmp_path / "first"
    assert driver.main(["--tiny", "--out", str(first), "--time-budget-min", "0.2", "--snapshot-minutes", "0.2",
                        "--device", "cpu", "--log-interval", "1"]) == 0
    a = json.load(open(first / "proof.json"))
    export = a["snapshots"][0]["export"]

    # the export's weights (bf16 there) and the checkpoint's (fp32) are the same drafter
    common = ["--tiny", "--target-model", str(first / "tiny_target"), "--prompts", str(first / "tiny_prompts.jsonl"),
              "--device", "cpu", "--time-budget-min", "0.05", "--log-interval", "1"]
    _, _, cfg = driver.parse_args(common + ["--out", str(first)])
    drafter_cfg = train.drafter_config_for(dataclasses.replace(cfg, mask_token_id=511))[2]
    from_export = train.initial_weights(export, drafter_cfg)
    from_ckpt = train.initial_weights(a["snapshots"][0]["checkpoint"], drafter_cfg)
    exported = load_file(os.path.join(export, "model.safetensors"))
    assert set(from_export) == set(exported) == set(from_ckpt)
    for k, v in exported.items():
        assert torch.equal(from_export[k], v.float())
        assert torch.equal(from_ckpt[k].to(torch.bfloat16), v)

    second = tmp_path / "second"
    assert driver.main(common + ["--out", str(second), "--init-drafter", export]) == 0
    b = json.load(open(second / "proof.json"))
    assert b["init_drafter"] == export and f"--init-drafter={export}" in b["train_command"]
    # warm: its first step's loss is below the cold start's, on the same first batch
    assert b["curve"][0]["step"] == a["curve"][0]["step"] == 1
    assert b["curve"][0]["loss"] < 0.9 * a["curve"][0]["loss"]
    assert b["snapshots"][0]["eval"]["lossless"]

    capsys.readouterr()
    third = tmp_path / "third"
    assert driver.main(common + ["--out", str(third), "--init-drafter", export, "--block-size", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is another drafter (block_size 8 there, 4 here)" in err
    assert os.listdir(third) == []  # no split, data or training
    assert driver.main(common + ["--out", str(third), "--init-drafter", str(tmp_path)]) == 2
    assert "is neither an export dir" in capsys.readouterr().err
