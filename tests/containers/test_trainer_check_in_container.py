"""Issue 30 through the production chain (Ansible -> ssh -tt -> pct -> a harness container, the checkout's trainer
wheel): a restart whose configuration the installed trainer refuses (`dflash-train --check` in the container) stops
nothing. The live run keeps its pid and goes on stepping, no launch.json is written and no log is rotated; the task
fails with the trainer's own line, once, and with bad_input. Also in check mode (--check --diff), for a target and
data directory that do not exist, and for a torchrun job whose layout the trainer's ranks would refuse."""
import time

import pytest

from harness.fixtures import REPO_ROOT

pytestmark = pytest.mark.containers
PLAYBOOKS = REPO_ROOT / "playbooks"
RESTART_TASK = "Training run tiny: restarted"
RUN_DIR = "/workspace/runs/tiny"
REFUSED = "the trainer's check refused this configuration, so nothing was stopped (tiny (pid %d) still running): "


def _step(ct):
    return (ct.read_json(RUN_DIR + "/heartbeat.json") or {}).get("step") or 0


def _run_files(ct):
    return ct.sh(f"cd {RUN_DIR} && ls -1 && md5sum launch.json").stdout


# 0.2 s after each step (the trainer's test hook): the live run only has to go on stepping through the plays
PAUSED = {"DFLASH_DEBUG_STEP_PAUSE_S": "0.2"}


def _with(trainer_args=None, **run):
    """-e dflash_runs: the run tiny with these trainer_args (on top of the inventory's dflash_run_defaults)."""
    return {"tiny": dict(run, trainer_args=trainer_args or {}, env=PAUSED)}


def test_a_refused_configuration_leaves_the_live_run_untouched(play, make_container):
    ct = make_container(200, trainer=True)
    first = play(PLAYBOOKS / "restart_training.yml", {"run": "tiny", "dflash_runs": _with()}, limit="ct200")
    live = first.task(RESTART_TASK)
    assert first.rc == 0 and live["action"] == "launched", first.stdout[-3000:]
    pid = live["pid"]
    files = _run_files(ct)
    cases = [
        # the everyday typo in trainer_args
        ({"dflash_runs": _with({"blok_size": 8})}, "",
         "unrecognized argument --blok-size=8: dflash-train has no flag --blok-size; did you mean --block-size?"),
        # --check --diff used to say `would launch` for directories that do not exist
        ({"dflash_runs": _with({"target_model": "/workspace/none", "data_dir": "/workspace/nodata"})},
         "--check --diff",
         "--target-model /workspace/none is not a directory; pass the local directory of the target model "
         "(dflash-make-tiny builds a tiny one); --data-dir /workspace/nodata is not a directory; pass the directory "
         "of *.parquet shards"),
        # a torchrun job of 3 ranks whose 3 target ranks would leave no drafter
        ({"dflash_runs": _with({"target_ranks": 3}, nproc_per_node=3)}, "",
         "--target-ranks 3 leaves 0 drafter ranks of the 3 torchrun started; pass --target-ranks between 1 and 2"),
    ]
    for extra, cmdline, line in cases:
        for flags in sorted({cmdline, "--check --diff"}):
            step = _step(ct)
            r = play(PLAYBOOKS / "restart_training.yml", dict(extra, run="tiny"), limit="ct200", cmdline=flags)
            res = r.task(RESTART_TASK)
            assert r.rc == 2 and r.status == "failed" and res.get("bad_input") is True, (flags, res)
            assert res["msg"] == "run tiny: " + REFUSED % pid + line, res["msg"]
            assert r.stdout.count(line) == 1, r.stdout[-3000:]  # said once: one line, no traceback, no dump
            assert "Traceback" not in r.stdout
            deadline = time.monotonic() + 60
            while _step(ct) <= step:  # the live run goes on stepping
                assert time.monotonic() < deadline, "the live run stopped stepping"
                time.sleep(0.5)
            assert int(ct.read(RUN_DIR + "/pid")) == pid and ct.pids("dflash-train") == [pid]
            assert _run_files(ct) == files  # no new launch.json, no rotated log
