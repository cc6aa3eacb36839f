"""Under torchrun on the CPU (gloo): a target rank's layers split over several devices, and FSDP2 drafter ranks.

Each compares with a DDP job of 1 target + 2 drafter ranks on the same data and seed (2 micro-batches per optimizer
step in every job), which test_dist_train.py shows equal to one process. Every job trains one epoch of SHAPE: 23
micro-batches, so that its last step is short (test_a_short_last_step compares the DDP job with one process)."""

import os
import shutil

import pytest
import torch

from trainer_testlib import read_metrics, start, torchrun_cmd, train_cmd
from dflash_trainer.loop.checkpoint import find_latest, load_checkpoint
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig

STEPS = 12
SHAPE = ("--token-budget", "768", "--max-batch-size", "5", "--epochs", "1")  # 23 micro-batches: 12 steps of 2


def losses(run_dir):
    return {r["step"]: (r["loss"], r["data_crc"]) for r in read_metrics(run_dir)}


def run(tiny, tmp_path, out, name, nproc, target_ranks, *extra):
    log = tmp_path / f"{name}.log"
    proc = start(torchrun_cmd(tiny, out, nproc, target_ranks, "--hs-queue-depth", "3", "--hs-queue-min-ready", "2",
                              *SHAPE, *extra), log)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    return log.read_text()


def assert_close(rows, ref, tol=1e-4):
    assert rows, "no metrics"
    for step, (loss, crc) in rows.items():
        assert crc == ref[step][1], f"step {step}: other batches than the DDP run"
        assert abs(loss - ref[step][0]) <= tol * max(1.0, abs(loss)), (step, loss, ref[step][0])


@pytest.fixture(scope="module")
def ddp(tiny, tmp_path_factory):
    """1 target + 2 DDP drafter ranks, one micro-batch each per step (the last step: 1 micro-batch, rank 2 none)."""
    tmp = tmp_path_factory.mktemp("ddp")
    text = run(tiny, tmp, tmp / "out", "ddp", 3, 1, "--grad-accum", "1", "--max-steps", str(STEPS),
               "--checkpoint-interval", str(DDP_SAVED), "--drafter-sharding", "ddp")
    assert "drafter ranks: ddp (--drafter-sharding ddp)" in text
    return losses(tmp / "out"), tmp / "out"


DDP_SAVED, FSDP_SAVED = 4, 6  # the DDP job's checkpoint the FSDP job resumes, and the FSDP one the split job resumes


@pytest.fixture(scope="module")
def chain(tiny, tmp_path_factory, ddp):
    """One chain of jobs (each a job of its own cost 10-20 CPU-s, mostly imports): the DDP job's step-4 checkpoint
    resumed by 2 FSDP drafter ranks with a compile warm-up (steps 5-12); their step-6 checkpoint resumed by
    1 target rank with its layers split over 2 devices + 1 DDP drafter rank (2 micro-batches; steps 7-12). Each
    part is the rest of the DDP run's trajectory."""
    tmp = tmp_path_factory.mktemp("chain")
    out = tmp / "out"
    shutil.copytree(ddp[1] / "checkpoints" / f"step-{DDP_SAVED}", out / "checkpoints" / f"step-{DDP_SAVED}")
    fsdp = run(tiny, tmp, out, "fsdp", 3, 1, "--grad-accum", "1", "--max-steps", str(STEPS),
               "--checkpoint-interval", str(FSDP_SAVED), "--drafter-sharding", "fsdp",
               "--compile-warmup-batches", "2")
    fsdp_rows = losses(out)
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS}")  # the split job resumes from the middle one
    saved = find_latest(str(out))
    split = run(tiny, tmp, out, "split", 2, 1, "--grad-accum", "2", "--max-steps", str(STEPS),
                "--drafter-sharding", "ddp", "--target-gpus-per-rank", "2")
    return {"out": out, "fsdp": fsdp, "fsdp_rows": fsdp_rows, "saved": saved, "split": split}


def test_a_ddp_checkpoint_resumes_under_fsdp_with_a_compile_warmup(chain, ddp):
    """2 FSDP drafter ranks (each takes its shard of the whole optimizer state): the rest of the DDP run's
    trajectory; the compile warm-up trains nothing."""
    text, rows = chain["fsdp"], chain["fsdp_rows"]
    assert f"resumed from {chain['out'] / 'checkpoints' / f'step-{DDP_SAVED}'} at step {DDP_SAVED}" in text
    assert "drafter ranks: fsdp (--drafter-sharding fsdp)" in text
    assert text.count("compile warm-up: 2 micro-batches") == 2  # both ranks, gathering alike; nothing trained
    assert sorted(rows) == list(range(DDP_SAVED + 1, STEPS + 1))
    assert_close(rows, ddp[0])


def test_an_fsdp_checkpoint_is_whole_and_resumes_under_ddp(chain, ddp):
    # the checkpoint is whole: every trainable tensor at its full shape, the optimizer state keyed as one process
    path, out = chain["saved"], chain["out"]
    assert path.endswith(f"step-{FSDP_SAVED}")
    weights, drafter_cfg, train_state = load_checkpoint(path)
    plain = DFlashDrafter(DrafterConfig.from_dict(drafter_cfg)).trainable_state_dict()
    assert {k: tuple(v.shape) for k, v in weights.items()} == {k: tuple(v.shape) for k, v in plain.items()}
    params = list(plain.values())
    state = train_state["optimizer"]["state"]
    assert sorted(state) == list(range(len(params)))
    assert all(state[i]["exp_avg"].shape == params[i].shape for i in state)
    assert all(type(v) is torch.Tensor for s in state.values() for v in s.values())
    # resumed by 1 target + 1 DDP drafter rank (2 micro-batches): the rest of the DDP run's trajectory
    assert f"resumed from {path} at step {FSDP_SAVED}" in chain["split"]
    assert "drafter ranks: ddp (--drafter-sharding ddp)" in chain["split"]
    steps = [r["step"] for r in read_metrics(out)]
    assert steps == list(range(DDP_SAVED + 1, STEPS + 1)) + list(range(FSDP_SAVED + 1, STEPS + 1))
    assert_close(losses(out), ddp[0])  # the resumed rows (the later ones) replace the FSDP job's
    assert not os.listdir(out / "ranks")


def test_split_target_rank_trains_as_the_replica_does(chain, ddp):
    """The chain's last job: 1 target rank with its 8 layers forced over 2 devices ('cpu' twice)."""
    text = chain["split"]
    assert "each target rank splits its layers over 2 devices (--target-gpus-per-rank 2)" in text
    assert "target layers split: layers 0-3 on cpu, 4-7 on cpu" in text
    rows = {step: row for step, row in losses(chain["out"]).items() if step > FSDP_SAVED}
    assert sorted(rows) == list(range(FSDP_SAVED + 1, STEPS + 1))
    assert_close(rows, ddp[0])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sharding,accum,num_steps", [("fsdp", 5, 3), ("ddp", 1, 12)])
def test_a_short_last_step(tiny, tmp_path, request, sharding, accum, num_steps):
    """23 micro-batches in an epoch (--token-budget 768, 5 a batch) over 2 drafter ranks, dealt g % 2.
    FSDP, 10 a step with a queue shallower than 5: each rank has its next micro-batch while the other computes
    (dealt in blocks of 5 this deadlocked in the first forward's gather); the last step has 3, dealt 2 + 1, and the
    second rank runs one zero-weighted repeat so that both gather alike. DDP, 2 a step: the last has 1, the second
    rank none, and the gradients are summed by hand (the module's DDP job, which has this shape). Same losses as one
    process."""
    one = tmp_path / "one"
    proc = start(train_cmd(tiny, one, "--grad-accum", str(2 * accum), *SHAPE), tmp_path / "one.log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "one.log").read_text()[-3000:]
    if sharding == "ddp":
        out = request.getfixturevalue("ddp")[1]
    else:
        out = tmp_path / "out"
        run(tiny, tmp_path, out, sharding, 3, 1, "--grad-accum", str(accum), "--drafter-sharding", sharding)
    rows, ref = losses(out), losses(one)
    assert sorted(rows) == sorted(ref) == list(range(1, num_steps + 1))
    assert_close(rows, ref)
