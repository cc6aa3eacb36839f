"""Hostile run names and values are refused or passed literally; secrets stay out of argv, logs and launch.json."""
import json
import os

import pytest
from ansible_helpers import FAKE, starts

pytestmark = pytest.mark.timeout(120)

HOSTILE = ["x; touch {pwned}", "$(touch {pwned})", "`touch {pwned}`", "a'b\"c", "line1\nline2", "--help", "*"]


@pytest.mark.parametrize("name", ["x; touch {pwned}", "$(id)", "../escape", "..", "a b", "", "x" * 65, "r\n1"])
def test_hostile_run_names_are_refused_before_anything_runs(ansible, runs_root, tmp_path, name):
    pwned = tmp_path / "pwned"
    ok, res = ansible.module("dflash.ops.training_run", {
        "name": name.format(pwned=pwned), "transport": "local", "runs_root": str(runs_root), "command": [FAKE]})
    assert not ok and "invalid run name" in res["msg"]
    assert "\n" not in res["msg"].strip() or name == "r\n1"
    assert not pwned.exists() and os.listdir(str(runs_root)) == []


def test_hostile_values_reach_the_trainer_literally(ansible, runs_root, tmp_path):
    pwned = tmp_path / "pwned"
    values = [v.format(pwned=pwned) for v in HOSTILE]
    env = dict(("V%d" % i, v) for i, v in enumerate(values))
    env["FAKE_SHOW_ENV"] = ",".join(sorted(env) + ["DFLASH_STOP_REPORT_S"])
    trainer_args = dict(("arg%d" % i, v) for i, v in enumerate(values))
    ok, res = ansible.module("dflash.ops.training_run", {
        "name": "literal", "transport": "local", "runs_root": str(runs_root), "command": [FAKE],
        "env": env, "trainer_args": trainer_args, "cwd": str(tmp_path), "stop_timeout": 40})
    assert ok, res.get("msg")
    seen = starts(runs_root / "literal")[0]
    for i, v in enumerate(values):
        assert seen["env"]["V%d" % i] == v
        assert "--arg%d=%s" % (i, v) in seen["argv"]
    assert not pwned.exists()
    # Nothing of the caller's environment leaks in: only what was given, plus PATH and the run's own.
    # (LC_CTYPE: the fake trainer's own Python sets it at start when no locale is given, PEP 538.)
    # and when a stop that hangs prints each thread's stack: at nine tenths of the stop timeout, before the SIGKILL
    assert set(seen["env_names"]) - {"LC_CTYPE"} == set(env) | {"PATH", "DFLASH_RUN_DIR", "DFLASH_RUN_NAME",
                                                                 "DFLASH_LAUNCH_REASON", "DFLASH_STOP_REPORT_S"}
    assert seen["env"]["DFLASH_STOP_REPORT_S"] == "36"


@pytest.mark.parametrize("bad,msg", [
    ({"env": {"1BAD": "x"}}, "invalid environment variable name"),
    ({"env": {"A;B": "x"}}, "invalid environment variable name"),
    ({"trainer_args": {"a b": 1}}, "invalid trainer flag name"),
    ({"runs_root": "relative/runs"}, "absolute path"),
    ({"gpu_device_pattern": "/dev/nvidia0"}, "{index}"),
    ({"env": {"K": "1"}, "secret_env": {"K": "2"}}, "both env and secret_env"),
])
def test_bad_options_get_one_line_errors(ansible, runs_root, bad, msg):
    a = {"name": "bad", "transport": "local", "runs_root": str(runs_root), "command": [FAKE]}
    a.update(bad)
    if a["runs_root"] == "relative/runs":
        a["runs_root"] = "relative/runs"
    ok, res = ansible.module("dflash.ops.training_run", a)
    assert not ok and msg in res["msg"] and "\n" not in res["msg"]
    assert not os.path.exists(str(runs_root / "bad"))


def test_secrets_never_land_in_argv_logs_or_launch_json(ansible, runs_root):
    secret = "s3cr3t-Value-4b1d"
    ok, res = ansible.module("dflash.ops.training_run", {
        "name": "sec", "transport": "local", "runs_root": str(runs_root), "command": [FAKE],
        "secret_env": {"WANDB_API_KEY": secret},
        "env": {"FAKE_HASH_ENV": "WANDB_API_KEY", "FAKE_SHOW_ENV": "DFLASH_STOP_REPORT_S", "DFLASH_STOP_REPORT_S": "5"}})
    assert ok, res.get("msg")
    run_dir = runs_root / "sec"
    seen = starts(run_dir)[0]
    assert seen["env"]["DFLASH_STOP_REPORT_S"] == "5"  # a run's env sets it over the stop timeout's nine tenths
    import hashlib
    assert seen["secret_sha"]["WANDB_API_KEY"] == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in json.dumps(res)
    launch = (run_dir / "launch.json").read_text()
    assert secret not in launch and "WANDB_API_KEY" in json.loads(launch)["secret_env_names"]
    with open("/proc/%d/cmdline" % res["pid"], "rb") as f:
        assert secret.encode() not in f.read()
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
