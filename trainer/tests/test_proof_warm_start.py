"""--init-drafter: a proof that starts from an earlier run's export (or checkpoint) — the way a drafter's
training can go on in a later session — and refuses weights of another drafter shape before it writes."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from trainer_testlib import load_benchmark


@pytest.mark.timeout(240)
def test_warm_start_continues_from_the_export_and_refuses_another_shape(tmp_path, capsys):
    driver = load_benchmark("proof_smollm2")
    proof_train = load_benchmark("proof_train")
    first = tmp_path / "first"
    assert driver.main(["--tiny", "--out", str(first), "--minutes", "0.05", "--device", "cpu"]) == 0
    a = json.load(open(first / "proof.json"))
    export = a["snapshots"][0]["export"]

    # the export's weights (bf16 there) and the checkpoint's (fp32) are the same drafter
    args = driver.parse_args(["--tiny", "--out", str(first), "--target", str(first / "tiny_target"),
                              "--prompts", str(first / "tiny_prompts.jsonl")])
    cfg = proof_train.drafter_config(args, 511)
    from_export = proof_train.initial_weights(export, cfg)
    from_ckpt = proof_train.initial_weights(a["snapshots"][0]["checkpoint"], cfg)
    exported = load_file(os.path.join(export, "model.safetensors"))
    assert set(from_export) == set(exported) == set(from_ckpt)
    for k, v in exported.items():
        assert torch.equal(from_export[k], v.float())
        assert torch.equal(from_ckpt[k].to(torch.bfloat16), v)

    common = ["--tiny", "--target", str(first / "tiny_target"), "--prompts", str(first / "tiny_prompts.jsonl"),
              "--device", "cpu", "--minutes", "0.05", "--init-drafter", export]
    second = tmp_path / "second"
    assert driver.main(common + ["--out", str(second)]) == 0
    b = json.load(open(second / "proof.json"))
    assert b["init_drafter"] == export
    # warm: its first logged loss is below the cold start's first logged loss, at the same step
    assert b["curve"][0]["step"] == a["curve"][0]["step"]
    assert b["curve"][0]["loss"] < 0.9 * a["curve"][0]["loss"]
    assert b["snapshots"][0]["eval"]["lossless"]

    capsys.readouterr()
    third = tmp_path / "third"
    assert driver.main(common + ["--out", str(third), "--block-size", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is another drafter (block_size 8 there, 4 here)" in err
    assert os.listdir(third) == []  # no split, data or training
    assert driver.main(common[:-1] + [str(tmp_path), "--out", str(third)]) == 2
    assert "is neither an export dir" in capsys.readouterr().err
