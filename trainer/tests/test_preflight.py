"""dflash-train --check: the configuration parsed and checked as a launch would, nothing run or written; every
problem one line naming the flag and the fix, exit 2; `ok` and 0 with one JSON report line (issue 30)."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from trainer_testlib import train_cmd


def check(cmd, env=None):
    argv = cmd[:3] + ["--check"] + cmd[3:]  # python -m dflash_trainer.cli --check FLAGS
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ, **(env or {})))
    lines = proc.stdout.splitlines()
    return proc.returncode, json.loads(lines[0]), lines[1:], proc.stderr.splitlines()


def test_a_good_configuration_is_ok_with_the_settings_and_creates_nothing(tiny, tmp_path):
    out = tmp_path / "out"
    rc, report, rest, err = check(train_cmd(tiny, out))
    assert (rc, report["check"], rest, err) == (0, "ok", ["ok"], [])
    assert report["settings"] == {"run_dir": str(out), "output_dir": str(out),
                                  "checkpoints": str(out / "checkpoints"), "keep_checkpoints": 3}
    assert report["world_size"] == 1 and report["layout"] is None
    assert not out.exists()  # no heartbeat, no output directory


def test_every_problem_is_one_line_naming_the_flag_and_nothing_is_written(tiny, tmp_path):
    cmd = train_cmd(tiny, tmp_path / "out", "--blok-size=8", "--lr", "x", "--target-model", str(tmp_path / "none"),
                    "--data-dir", str(tmp_path / "nodata"))
    rc, report, rest, err = check(cmd)
    assert rc == 2 and report["check"] == "failed" and rest == []
    assert err == [
        "dflash-train: error: unrecognized argument --blok-size=8: dflash-train has no flag --blok-size; did you "
        "mean --block-size?",
        "dflash-train: error: --lr 'x' is not a number; pass e.g. --lr 0.5",
        f"dflash-train: error: --target-model {tmp_path / 'none'} is not a directory; pass the local directory of "
        "the target model (dflash-make-tiny builds a tiny one)",
        f"dflash-train: error: --data-dir {tmp_path / 'nodata'} is not a directory; pass the directory of *.parquet "
        "shards",
    ]
    assert report["problems"] == [line.split("error: ", 1)[1] for line in err]
    assert not (tmp_path / "out").exists()


def test_a_torchrun_layout_is_the_ranks_own_rule_and_an_impossible_one_is_refused(tiny, tmp_path):
    from dflash_trainer.config import TrainConfig
    from dflash_trainer.distributed.world import plan_layout
    rc, report, rest, _err = check(train_cmd(tiny, tmp_path / "out", "--target-ranks", "1"), {"WORLD_SIZE": "3"})
    assert rc == 0 and rest == ["ok"] and report["world_size"] == 3
    cfg = TrainConfig(target_model=tiny["target"], data_dir=tiny["data"], output_dir=str(tmp_path), target_ranks=1)
    assert report["layout"] == plan_layout(cfg, 3, cuda=False)[2]
    assert [row["role"] for row in report["layout"]] == ["target", "drafter", "drafter"]
    rc, report, _rest, err = check(train_cmd(tiny, tmp_path / "out", "--target-ranks", "3"), {"WORLD_SIZE": "3"})
    assert rc == 2 and report["layout"] is None
    assert err == ["dflash-train: error: --target-ranks 3 leaves 0 drafter ranks of the 3 torchrun started; pass "
                   "--target-ranks between 1 and 2"]


def test_data_tokenized_for_another_model_is_refused(tiny, tmp_path):
    data = tmp_path / "other"
    data.mkdir()
    ids = pa.array([[1, 2, 900]], pa.list_(pa.int32()))  # the tiny target's vocabulary is 512
    pq.write_table(pa.table({"input_ids": ids, "loss_mask": pa.array([[0, 1, 1]], pa.list_(pa.int8()))}),
                   data / "shard-00000.parquet")
    rc, _report, _rest, err = check(train_cmd(tiny, tmp_path / "out", "--data-dir", str(data)))
    assert rc == 2 and len(err) == 1
    assert err[0].startswith(f"dflash-train: error: --data-dir {data}: shard shard-00000.parquet holds token id 900, "
                             "outside --target-model's vocabulary (vocab_size 512)")


def test_an_output_dir_that_cannot_be_made_and_gpus_without_cuda_are_refused(tiny, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cmd = train_cmd(tiny, blocker / "out")
    cmd[cmd.index("--target-gpus") + 1], cmd[cmd.index("--drafter-gpus") + 1] = "0", "1"
    rc, _report, _rest, err = check(cmd)
    assert rc == 2
    assert err == [f"dflash-train: error: --output-dir {blocker / 'out'}: {blocker} is not a directory; pass a "
                   "directory path",
                   f"dflash-train: error: --run-dir {blocker / 'out'}: {blocker} is not a directory; pass a "
                   "directory path",
                   "dflash-train: error: GPUs [0, 1] requested but CUDA is not available; pass --target-gpus '' "
                   "--drafter-gpus '' (or --device cpu) to train on the CPU"]


def test_a_missing_required_flag_is_named(tiny, tmp_path):
    cmd = [sys.executable, "-m", "dflash_trainer.cli", "--target-model", tiny["target"], "--data-dir", tiny["data"]]
    rc, _report, _rest, err = check(cmd)
    assert rc == 2 and err == ["dflash-train: error: --output-dir is required; pass it (e.g. --output-dir "
                               "/workspace/runs/r1/out)"]


def test_a_model_family_transformers_does_not_have_is_refused(tiny, tmp_path):
    import shutil
    target = tmp_path / "target"
    shutil.copytree(tiny["target"], target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(dict(config, model_type="nosuchfamily")))
    rc, _report, _rest, err = check(train_cmd(tiny, tmp_path / "out", "--target-model", str(target)))
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"dflash-train: error: --target-model {target}: model_type 'nosuchfamily' is not a "
                             "family transformers ")


def test_queues_that_cannot_fit_the_host_are_refused_with_the_ranks_own_line(tiny, tmp_path):
    # 10**6 queued micro-batches of 1,024 tokens x 5 taps x hidden 64 x 4 bytes: ~1.3 TB for the 2 drafter ranks
    cmd = train_cmd(tiny, tmp_path / "out", "--target-ranks", "1", "--hs-queue-depth", "1000000")
    rc, _report, _rest, err = check(cmd, {"WORLD_SIZE": "3"})
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("dflash-train: error: the hidden-state queues need ") and "lower --hs-queue-depth" in err[0]
