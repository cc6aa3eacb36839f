"""Issue 14's stop/restart on the CPU: the seed's layout (5 target + 3 drafter ranks of dflash-train under torchrun,
gloo) on a tiny target of the seed's family (Qwen3.5: Gated DeltaNet + full attention), started, stopped mid-run and
restarted through playbooks/restart_training.yml and stop_training.yml with a local inventory. The job resumes at
the step it saved on SIGTERM and, step for step, trains on the batches of an uninterrupted one-process run (the
metrics' data checksum) with its losses: no batch repeated or skipped.

Both runs keep --max-steps=STEPS (the learning-rate schedule depends on it) but neither trains all of it: the
restarted job is stopped a few steps past the one it resumed at, and the reference (run after the job) once it has
logged those steps."""
import json
import os
import subprocess
import sys

import pytest

from ansible_helpers import module_result, run_project_playbook
from dflash_trainer.telemetry.writers import read_jsonl
from harness.waiting import wait_for


def metrics(run_dir):
    return read_jsonl(os.path.join(run_dir, "metrics.jsonl"))


pytestmark = pytest.mark.slow
STEPS = 200  # long enough that the stop playbook (seconds of ansible start-up) comes mid-run
STEPS_AFTER_RESUME = 8  # compared past the resumed step: an epoch (the 96 tiny sequences make 8 steps), so that the
# comparison crosses an epoch boundary after the resume
TRAIN = {"block_size": 4, "max_anchors": 16, "num_draft_layers": 1, "gamma": 4, "token_budget": 1024,
         "max_seq_len": 256, "max_batch_size": 4, "lr": 3e-3, "log_interval": 1, "heartbeat_interval": 0.2,
         "checkpoint_interval": 1000, "max_steps": STEPS, "epochs": 50}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    subprocess.run([sys.executable, "-m", "dflash_trainer.prep.make_tiny", "--family", "qwen3_5", "--target-dir",
                    str(root / "target"), "--data-dir", str(root / "data"), "--num-sequences", "96"],
                   check=True, capture_output=True)
    return root


def reference_steps(tiny, last_step):
    """The uninterrupted reference: one process, 3 micro-batches per step (= 3 drafter ranks x 1), started once the
    job is done (beside it, it trained all along on the same two cores: over a hundred steps nobody read) and
    stopped once it has logged last_step steps."""
    ref = tiny / "ref"
    argv = [sys.executable, "-m", "dflash_trainer.cli", "--target-model", str(tiny / "target"), "--data-dir",
            str(tiny / "data"), "--output-dir", str(ref), "--target-gpus", "", "--drafter-gpus", "",
            "--grad-accum", "3"] + ["--%s=%s" % (k.replace("_", "-"), v) for k, v in TRAIN.items()]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        wait_for(lambda: len(metrics(str(ref))) >= last_step or proc.poll() is not None, 240,
                 "the reference run did not reach step %d within 240 s" % last_step)
        rows = metrics(str(ref))
        assert len(rows) >= last_step, "the reference run ended (exit %s) at step %d: %s" % (
            proc.poll(), len(rows), proc.communicate()[1][-2000:])
    finally:
        proc.kill()
        proc.communicate()
    return {r["step"]: r for r in rows}


def play(tmp_path, playbook, tiny, n=[0]):
    n[0] += 1
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps({"dflash_training": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "dflash_transport": "local", "dflash_runs_root": str(tmp_path / "runs"),
        "dflash_trainer_command": [sys.executable, "-m", "dflash_trainer.cli"],
        "dflash_wait_for_phase": "training", "dflash_heartbeat_timeout": 120, "dflash_phase_timeout": 180,
        # 0.2 s after each step (the trainer's test hook): fewer steps while the stop playbooks start, so fewer
        # for the reference to train again, and the cores left to the playbooks
        "dflash_run_defaults": {"env": {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                                        "DFLASH_DEBUG_STEP_PAUSE_S": "0.2"}},
        "dflash_runs": {"seed": {"nproc_per_node": 8, "trainer_args": dict(
            TRAIN, target_model=str(tiny / "target"), data_dir=str(tiny / "data"), output_dir=str(tmp_path / "out"),
            device="cpu", target_gpus=[], drafter_gpus=[], target_ranks=5, grad_accum=1,
            hs_queue_depth=4, hs_queue_min_ready=2)}}}}}}))
    status, events = run_project_playbook(tmp_path / ("runner-%d" % n[0]), playbook, str(inv), {"run": "seed"})
    assert status == "successful", events[-1]
    return module_result(events)


@pytest.mark.timeout(420)
def test_stop_then_restart_resumes_at_the_saved_step_and_repeats_or_skips_no_batch(tmp_path, tiny):
    run_dir = str(tmp_path / "runs" / "seed")
    try:
        first = play(tmp_path, "restart_training.yml", tiny)
        assert first["changed"] and [r["role"] for r in first["ranks"]] == ["target"] * 5 + ["drafter"] * 3
        wait_for(lambda: len(metrics(run_dir)) >= 3, 180, "no third optimizer step within 180 s")
        stopped = play(tmp_path, "stop_training.yml", tiny)
        assert stopped["changed"] and stopped["stopped"][0]["signal"] == "SIGTERM", stopped
        with open(os.path.join(run_dir, "heartbeat.json")) as f:
            hb = json.load(f)
        assert hb["stopped"] == "SIGTERM" and 3 <= hb["step"] < STEPS, hb
        saved = hb["step"]
        assert os.path.isdir(tmp_path / "out" / "checkpoints" / ("step-%d" % saved))

        again = play(tmp_path, "restart_training.yml", tiny)
        assert again["changed"] and again["pid"] != first["pid"]
        wait_for(lambda: len(metrics(run_dir)) >= saved + STEPS_AFTER_RESUME, 240,
                 "the restarted job did not log %d steps past step %d" % (STEPS_AFTER_RESUME, saved))
    finally:
        play(tmp_path, "stop_training.yml", tiny)
    log = open(os.path.join(run_dir, "train.log")).read()
    assert "at step %d" % saved in log and "resumed from" in log, log[-3000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) < STEPS, [r["step"] for r in rows]
    # compared through STEPS_AFTER_RESUME steps past the resumed one, not on to the last row: the job trains on while
    # the last stop playbook starts (~50 steps more), which the reference then had to train too
    last = saved + STEPS_AFTER_RESUME
    ref = reference_steps(tiny, last)
    for r in rows[:last]:
        assert r["data_crc"] == ref[r["step"]]["data_crc"], "step %d: other batches than the reference" % r["step"]
        assert abs(r["loss"] - ref[r["step"]]["loss"]) <= 1e-4 * max(1.0, abs(r["loss"])), (r, ref[r["step"]])
