"""dflash-train under torchrun on the CPU (gloo): target ranks feed drafter ranks (dist_train.py).

Every job is a real `python -m torch.distributed.run --standalone` of dflash-train on the tiny fixtures."""

import os
import signal
import threading
import time

import pytest

from trainer_testlib import alive, rank_pids, read_heartbeat, read_metrics, start, torchrun_cmd, train_cmd, wait_for
from dflash_trainer.loop.checkpoint import find_latest
from dflash_trainer.distributed.hs_queue import HiddenStateQueue, QueueClosed

STEPS = 24


def losses(run_dir):
    return [(r["step"], r["loss"], r["data_crc"]) for r in read_metrics(run_dir)]


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory):
    """One process, 2 micro-batches per optimizer step."""
    out = tmp_path_factory.mktemp("ref")
    proc = start(train_cmd(tiny, out / "ref", "--grad-accum", "2", "--max-steps", str(STEPS)), out / "ref.log")
    assert proc.wait(timeout=300) == 0, (out / "ref.log").read_text()[-3000:]
    return losses(out / "ref")


def _close_to(rows, ref_rows):
    ref = {step: (loss, crc) for step, loss, crc in ref_rows}
    for step, loss, crc in rows:
        assert crc == ref[step][1], f"step {step}: other batches than the single-process run"
        assert abs(loss - ref[step][0]) <= 1e-4 * max(1.0, abs(loss)), (step, loss, ref[step][0])


# 1 + 2 moves the hidden states without overlap (--hs-sync-transfers: in the loops, no threads): same losses. 1 + 1:
# the first job of the SIGTERM test below (a job of its own cost ~15 CPU-s, mostly imports).
@pytest.mark.parametrize("num_targets,num_drafters,sync", [(2, 1, False), (1, 2, True)])
def test_loss_equals_single_process_and_queue_bound_holds(tiny, tmp_path, reference, num_targets, num_drafters,
                                                          sync):
    out = tmp_path / "out"
    accum = 2 // num_drafters  # G = accum x drafters = the reference's 2 micro-batches per step
    proc = start(torchrun_cmd(tiny, out, num_targets + num_drafters, num_targets, "--grad-accum", str(accum),
                              "--max-steps", str(STEPS), "--hs-queue-depth", "3", "--hs-queue-min-ready", "2",
                              *(["--hs-sync-transfers"] if sync else [])),
                 tmp_path / "log")
    assert proc.wait(timeout=300) == 0, (tmp_path / "log").read_text()[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    _close_to(losses(out), reference)
    assert max(r["queue_high_water"] for r in rows) <= 3
    hb = read_heartbeat(out)
    assert hb["phase"] == "finished" and hb["step"] == STEPS and hb["pid"] == proc.pid
    # every rank's last step: the drafters' optimizer step, the targets' step of their last micro-batch sent
    ranks = hb["ranks"]
    assert sorted(ranks, key=int) == [str(r) for r in range(num_targets + num_drafters)]
    assert [ranks[str(r)]["role"] for r in range(num_targets + num_drafters)] == \
        ["target"] * num_targets + ["drafter"] * num_drafters
    assert all(ranks[str(r)]["step"] == STEPS for r in range(num_targets, num_targets + num_drafters))
    assert all(ranks[str(r)]["step"] == STEPS - 1 and ranks[str(r)]["done"] for r in range(num_targets))
    assert not os.listdir(out / "ranks")  # pid files go at a clean exit


def test_queue_reserves_before_receiving_and_reports_the_receivers_error():
    q = HiddenStateQueue(depth=2, min_ready=2)
    assert q.reserve() and q.reserve()
    blocked = threading.Thread(target=q.reserve, daemon=True)
    blocked.start()
    time.sleep(0.2)
    assert blocked.is_alive()  # a third transfer may not start while two slots are taken
    q.put("a")
    q.put("b")
    q.wait_ready(2)
    assert q.get() == "a"
    blocked.join(timeout=2)
    assert not blocked.is_alive() and q.high_water == 2
    q.drain()
    assert q.reserve() is False  # a stopped loop's queue takes nothing, so the targets never block
    q.close(RuntimeError("rank 0 went away"))
    with pytest.raises(QueueClosed, match="rank 0 went away"):
        q.get()


def test_queue_memory_check_refuses_with_the_numbers(tmp_path, monkeypatch):
    """Depth x bytes of one micro-batch of taps x this host's drafter ranks against the available host memory."""
    import json

    import torch

    from dflash_trainer.config import StartupError, TrainConfig
    from dflash_trainer.distributed.dist_train import check_queue_memory
    from dflash_trainer.distributed.world import World
    from dflash_trainer.distributed.hs_queue import batch_tap_bytes
    # the seed's settings: 49,152 tokens x 5 layers x 5,120 x 2 bytes ~ 2.5 GB a micro-batch, 90 -> ~226 GB
    seed = batch_tap_bytes(49152, 5, 5120, soft_labels=False, on_cuda=True)
    assert seed == 49152 * 5 * 5120 * 2 and round(90 * seed / 1e9, 1) == 226.5
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 5120}))
    cfg = TrainConfig(target_model=str(tmp_path), data_dir=str(tmp_path), output_dir=str(tmp_path))
    # rank 6 of 5 target + 3 drafter ranks on one host (torchrun's LOCAL_* variables)
    monkeypatch.setenv("LOCAL_RANK", "6")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    world = World(rank=6, world_size=8, num_target_ranks=5, num_drafter_ranks=3, device=torch.device("cuda", 6),
                  pid_file="")
    check_queue_memory(cfg, world, available=700 * 10**9)  # 3 x 226.5 = 679.5 GB fit
    with pytest.raises(StartupError) as refused:
        check_queue_memory(cfg, world, available=500 * 10**9)
    message = str(refused.value)
    assert "\n" not in message
    for part in ("679.5 GB", "--hs-queue-depth 90 x 2.52 GB", "--token-budget 49152 tokens x 5 layers x hidden 5120 x 2 "
                 "bytes", "3 drafter rank(s)", "500.0 GB is available", "lower --hs-queue-depth to 66"):
        assert part in message, message
    # one drafter rank per host (e.g. 1 target + 1 drafter per node); soft labels add the last hidden state
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    soft = TrainConfig(target_model=str(tmp_path), data_dir=str(tmp_path), output_dir=str(tmp_path),
                       use_soft_labels=True, hs_queue_depth=10, hs_queue_min_ready=2)
    one = World(rank=1, world_size=2, num_target_ranks=1, num_drafter_ranks=1, device=torch.device("cpu"), pid_file="")
    need = 10 * 49152 * 6 * 5120 * 4  # fp32 on the CPU
    check_queue_memory(soft, one, available=need)
    with pytest.raises(StartupError, match="1 drafter rank"):
        check_queue_memory(soft, one, available=need - 1)


def test_sigkilled_rank_ends_the_job_naming_it(tiny, tmp_path):
    out = tmp_path / "out"
    proc = start(torchrun_cmd(tiny, out, 3, 1, "--epochs", "50"), tmp_path / "log", env={"DFLASH_STOP_REPORT_S": "1"})
    try:
        pids = rank_pids(out, 3)
        wait_for(lambda: len(read_metrics(out)) >= 3, proc=proc, timeout=120)
        # a stalled rank shows in the heartbeat: its entry in `ranks` stops while the heartbeat goes on
        os.kill(pids[2], signal.SIGSTOP)
        time.sleep(1.5)
        hb = read_heartbeat(out)
        stalled = hb["ranks"]["2"]
        assert hb["updated_at"] - stalled["updated_at"] > 1.0, hb
        assert stalled["step"] <= hb["ranks"]["1"]["step"], hb
        # the other drafter cannot stop without it (they agree on the stop): 1 s after SIGTERM its log shows
        # where its threads wait (stop_report.py), though its main thread is blocked inside a collective
        os.kill(pids[1], signal.SIGTERM)
        report = f"dflash-train: pid {pids[1]} is still stopping 1 s after SIGTERM"
        in_loop = os.path.join("dflash_trainer", "loop", "")
        wait_for(lambda: in_loop in (tmp_path / "log").read_text().partition(report)[2], timeout=20)
        os.kill(pids[2], signal.SIGKILL)
        t0 = time.time()
        status = proc.wait(timeout=30)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "log").read_text()
    assert status != 0 and took < 30
    assert "Current thread" in log.partition(report)[2]  # faulthandler's dump of every thread
    # torchrun's failure summary lists every failed rank; the killed one with its signal (the root cause may be
    # a peer whose collective broke first, whichever the agent observed first)
    summary = log.split("FAILED")[-1]
    killed = summary.split("rank      : 2 ")[1].split("traceback")[0]
    assert "exitcode  : -9" in killed and "SIGKILL" in killed, summary
    wait_for(lambda: not any(alive(p) for p in pids), timeout=10)


# A SIGKILLed agent's ranks die with it: tests/integration/test_training_run_torchrun_local.py, the same job through
# the lifecycle, which checks the status and stop after it too.


@pytest.mark.timeout(300)  # two jobs, one after the other, on two cores
def test_sigterm_checkpoints_then_resume_in_another_world_repeats_and_skips_nothing(tiny, tmp_path, reference):
    out = tmp_path / "out"
    args = ("--max-steps", str(STEPS), "--checkpoint-interval", "1000", "--hs-queue-depth", "3",
            "--hs-queue-min-ready", "2")
    # 1 target + 1 drafter, 2 micro-batches per optimizer step: the reference's losses up to the SIGTERM
    first = start(torchrun_cmd(tiny, out, 2, 1, "--grad-accum", "2", *args), tmp_path / "log1")
    try:
        pids = rank_pids(out, 2)
        wait_for(lambda: len(read_metrics(out)) >= 3, proc=first, timeout=120, interval=0.02)
        for pid in [first.pid, *pids]:  # as the lifecycle stops a job: the agent and every rank
            os.kill(pid, signal.SIGTERM)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    saved = find_latest(str(out))
    # a stop that hangs prints each rank's stacks 20 s after SIGTERM (stop_report.py), 10 s before torchrun's SIGKILL
    assert saved, (tmp_path / "log1").read_text()[-15000:]
    step = int(os.path.basename(saved).split("-")[1])
    assert 3 <= step < STEPS
    assert [r[0] for r in losses(out)] == list(range(1, step + 1))
    _close_to(losses(out), reference)
    hb = read_heartbeat(out)
    assert hb["phase"] == "finished" and hb.get("stopped") == "SIGTERM" and hb["step"] == step
    assert not any(alive(p) for p in pids)
    assert [n for n in os.listdir(out / "ranks") if ".pid" in n] == []  # each rank removed its own at the exit

    # 1 target + 2 drafters, one micro-batch each: the same 2 per optimizer step
    again = start(torchrun_cmd(tiny, out, 3, 1, "--grad-accum", "1", *args), tmp_path / "log2")
    assert again.wait(timeout=300) == 0, (tmp_path / "log2").read_text()[-3000:]
    assert f"resumed from {saved} at step {step}" in (tmp_path / "log2").read_text()
    rows = losses(out)
    assert [r[0] for r in rows] == list(range(1, step + 1)) + list(range(step + 1, STEPS + 1))
    _close_to(rows, reference)
    assert max(r["queue_high_water"] for r in read_metrics(out)) <= 3


def test_shard_weights_reach_the_drafter_rank(tiny, tmp_path):
    """--shard-weights under torchrun (1 target + 1 drafter rank): the same weighted batches, step for step, as one
    process (that they are other rows than unweighted: test_data.py)."""
    args = ("--max-steps", "4", "--shard-weights", "shard-00000=0,shard-00001=2")
    one = start(train_cmd(tiny, tmp_path / "one", *args), tmp_path / "one.log")
    assert one.wait(timeout=300) == 0, (tmp_path / "one.log").read_text()[-3000:]
    job = start(torchrun_cmd(tiny, tmp_path / "dist", 2, 1, *args), tmp_path / "dist.log")
    assert job.wait(timeout=300) == 0, (tmp_path / "dist.log").read_text()[-3000:]
    crcs = [[(step, crc) for step, _, crc in losses(tmp_path / run)] for run in ("one", "dist")]
    assert len(crcs[0]) == 4 and crcs[0] == crcs[1]
    # both logs give the weighted epoch in one data line, the same one
    data = [[line.split("data: ", 1)[1] for line in (tmp_path / f"{run}.log").read_text().splitlines()
             if "data: " in line and "micro-batches/epoch" in line] for run in ("one", "dist")]
    assert len(data[1]) == 1 and data[0] == data[1], data
    assert "sequences an epoch by --shard-weights shard-00000=0,shard-00001=2)" in data[1][0]
