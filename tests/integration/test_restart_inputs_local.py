"""Issue 30 locally, as an operator types it: ansible-playbook restart_training.yml (the checkout's ansible.cfg)
with the real trainer on the CPU. A restart whose configuration the trainer's check refuses stops nothing (same pid,
step still advancing, no new launch.json, no rotated log) and says so in one line, once; --check --diff no longer
says `would launch` for directories that do not exist; bad -e input is one line naming the variable as written,
printed once, with no Jinja error and no argument-spec dump."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from ansible_helpers import BIN, FAKE, ROOT, live_pids_with

pytestmark = pytest.mark.timeout(600)
ENV = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
           PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
NOTHING_STOPPED = "the trainer's check refused this configuration, so nothing was stopped"


def inventory(tmp_path, command, trainer_args, tag):
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"dflash_training": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "dflash_transport": "local", "dflash_runs_root": str(tmp_path / "runs"), "dflash_trainer_command": command,
        "dflash_target_gpus": [], "dflash_drafter_gpus": [], "dflash_wait_for_phase": "training",
        # 0.2 s after each step of the real trainer (its test hook): the live run only has to step through the
        # refused plays
        "dflash_run_defaults": {"trainer_args": dict(trainer_args, tag=tag) if tag else trainer_args,
                                "env": {"OMP_NUM_THREADS": "1", "DFLASH_DEBUG_STEP_PAUSE_S": "0.2"}},
        "dflash_runs": {"r1": {}}}}}}))
    return str(path)


def playbook(inv, *extra, name="restart_training.yml"):
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inv, os.path.join(ROOT, "playbooks", name),
                           "-e", "run=r1", *extra], env=ENV, capture_output=True, text=True, cwd=ROOT, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def real_args(tiny, tmp_path):
    return {"target_model": str(tiny / "target"), "data_dir": str(tiny / "data"), "output_dir": str(tmp_path / "out"),
            "device": "cpu", "epochs": 1000, "block_size": 4, "max_anchors": 16, "num_draft_layers": 1, "gamma": 4,
            "token_budget": 1024, "max_seq_len": 256, "max_batch_size": 4, "grad_accum": 1, "log_interval": 1,
            "heartbeat_interval": 0.2, "checkpoint_interval": 1000}


def _listing(run_dir):
    """The run dir's files, less the heartbeat's atomic write in progress (.heartbeat.json.tmp-<pid>, renamed over
    heartbeat.json every heartbeat_interval): a listing may catch it or not."""
    return sorted(name for name in os.listdir(run_dir) if ".tmp-" not in name)


def _step(run_dir):
    with open(os.path.join(run_dir, "heartbeat.json")) as f:
        return json.load(f).get("step") or 0


def test_a_typo_and_missing_directories_stop_nothing_and_say_so_once(tiny, tmp_path):
    args = real_args(tiny, tmp_path)
    inv = inventory(tmp_path, [os.path.join(BIN, "dflash-train")], args, None)
    run_dir = str(tmp_path / "runs" / "r1")
    try:
        rc, out = playbook(inv)
        assert rc == 0, out[-3000:]
        pid = int(open(os.path.join(run_dir, "pid")).read())
        launch = open(os.path.join(run_dir, "launch.json")).read()
        files = _listing(run_dir)
        typo = json.dumps({"dflash_runs": {"r1": {"trainer_args": {"blok_size": 8}}}})
        missing = json.dumps({"dflash_runs": {"r1": {"trainer_args": {"target_model": str(tmp_path / "none"),
                                                                      "data_dir": str(tmp_path / "nodata")}}}})
        cases = [
            ((typo,), "unrecognized argument --blok-size=8: dflash-train has no flag --blok-size; did you mean "
                      "--block-size?"),
            ((typo, "--check", "--diff"), "unrecognized argument --blok-size=8"),
            ((missing, "--check", "--diff"), "--target-model %s is not a directory; pass the local directory of the "
                                             "target model (dflash-make-tiny builds a tiny one); --data-dir %s is "
                                             "not a directory" % (tmp_path / "none", tmp_path / "nodata")),
        ]
        for extra, line in cases:
            step = _step(run_dir)
            rc, out = playbook(inv, "-e", *extra)
            assert rc == 2 and "would launch" not in out, out[-3000:]
            assert out.count(line) == 1 and out.count(NOTHING_STOPPED) == 1, out[-3000:]
            assert "fatal: [localhost]: run r1: %s (r1 (pid %d) still running): " % (NOTHING_STOPPED, pid) in out
            assert "Traceback" not in out
            deadline = time.monotonic() + 60
            while _step(run_dir) <= step:
                assert time.monotonic() < deadline, "the live run stopped stepping"
                time.sleep(0.2)
            assert int(open(os.path.join(run_dir, "pid")).read()) == pid
            assert open(os.path.join(run_dir, "launch.json")).read() == launch
            assert _listing(run_dir) == files  # no new launch record, no rotated log
    finally:
        playbook(inv, name="stop_training.yml")


@pytest.mark.parametrize("extra,line", [
    (["-e", "dflash_target_gpus=0,x"],
     'dflash_target_gpus is "0,x": "x" is not a GPU index (a whole number from 0); give GPU indexes as a list or a '
     "comma string, e.g. dflash_target_gpus=0,1,2 or dflash_target_gpus: [0, 1, 2]; nothing was run"),
    (["-e", '{"dflash_target_gpus": [0, "x"]}'], 'dflash_target_gpus is [0, "x"]: "x" is not a GPU index'),
    (["-e", "run=nope"], "undeclared run nope: declared runs are r1 (dflash_runs); fix the name, or add the run to "
                         "dflash_runs in the inventory; nothing was run"),
    (["-e", "force=maybe"], 'force is "maybe"; give true or false, e.g. -e force=true; nothing was run'),
    (["-e", "dflash_stop_timeout=soon"], 'dflash_stop_timeout is "soon", not a number of seconds'),
    (["-e", '{"dflash_runs": {"r1": {"trainer_args": {"lr": {"x": 1}}}}}'],
     'dflash_runs.r1.trainer_args.lr is {"x": 1}; a trainer flag takes a string, number, true/false or a list'),
])
def test_bad_input_is_one_line_naming_the_variable_printed_once(tmp_path, extra, line):
    tag = "inputs-%d" % os.getpid()
    inv = inventory(tmp_path, [FAKE], {"interval": 0.05}, tag)
    try:
        rc, out = playbook(inv, *extra)
        assert rc == 2, out
        failed = [ln for ln in out.splitlines() if ln.startswith("fatal:")]
        assert len(failed) == 1 and line in failed[0] and out.count(line) == 1, out
        for noise in ("Traceback", "Error rendering template", "argument_spec", "training_gpus", "[ERROR]"):
            assert noise not in out, out
        assert not (tmp_path / "runs").exists()
    finally:
        for pid in live_pids_with("--tag=" + tag):
            os.kill(pid, signal.SIGKILL)


def test_a_comma_string_of_gpus_is_a_gpu_list(tmp_path):
    tag = "inputs-gpus-%d" % os.getpid()
    inv = inventory(tmp_path, [FAKE], {"interval": 0.05}, tag)
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in (0, 1):
        (dev / ("nvidia%d" % i)).write_text("")
    rc, out = playbook(inv, "-e", "dflash_target_gpus=0,1", "-e", "dflash_gpu_device_pattern=%s/nvidia{index}" % dev,
                       "--check")
    assert rc == 0 and "would launch" in out, out[-3000:]
