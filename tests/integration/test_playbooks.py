"""Playbooks, role and collection metadata: syntax, docs, argument specs, and the playbook-level
idempotence (check, run, check again, run again) through ansible-runner with the local inventory. The built
tarball: test_collection_tarball.py."""
import json
import os
import subprocess
import sys

import pytest
import yaml
from ansible_helpers import BIN, FAKE, ROOT, live_pids_with, module_result, run_project_playbook

ENV = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
           PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
PLAYBOOKS = ["restart_training.yml", "stop_training.yml", "training_status.yml"]


@pytest.mark.parametrize("inventory", ["local", "example", "harness"])
def test_syntax_check(inventory):
    """Every playbook with each inventory: one ansible-playbook run checks them all (it fails naming the playbook)."""
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "--syntax-check", "-i",
                           os.path.join(ROOT, "inventories", inventory)]
                          + [os.path.join(ROOT, "playbooks", playbook) for playbook in PLAYBOOKS],
                          env=ENV, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("playbook: ") == len(PLAYBOOKS), proc.stdout


@pytest.mark.parametrize("module", ["training_run", "pct_exec"])
def test_ansible_doc_shows_the_module(module):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-t", "module", "--json", "dflash.ops." + module],
                          env=ENV, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["dflash.ops." + module]
    assert doc["doc"]["options"] and doc["examples"] and doc["return"]


def test_role_defaults_match_argument_specs():
    with open(os.path.join(ROOT, "roles", "training", "defaults", "main.yml")) as f:
        defaults = yaml.safe_load(f)
    with open(os.path.join(ROOT, "roles", "training", "meta", "argument_specs.yml")) as f:
        spec = yaml.safe_load(f)["argument_specs"]["main"]["options"]
    assert set(defaults) == set(spec)
    assert all(name.startswith("training_") for name in defaults)


def _play(tmp_path, playbook, extravars, check=False, n=[0]):
    n[0] += 1
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps({"dflash_training": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "dflash_transport": "local", "dflash_runs_root": str(tmp_path / "runs"), "dflash_trainer_command": [FAKE],
        "dflash_run_defaults": {"trainer_args": {"lr": 1, "tag": "pb-test"}, "env": {"A": "1"}},
        "dflash_runs": {"r1": {"trainer_args": {"lr": 2}}}}}}}))
    return run_project_playbook(tmp_path / ("runner-%d" % n[0]), playbook, str(inv), extravars, check=check)


def test_restart_playbook_is_idempotent_four_ways(tmp_path):
    try:
        status, ev = _play(tmp_path, "restart_training.yml", {"run": "r1"}, check=True)
        assert status == "successful" and module_result(ev)["changed"]
        assert live_pids_with("--tag=pb-test") == []
        status, ev = _play(tmp_path, "restart_training.yml", {"run": "r1"})
        first = module_result(ev)
        assert status == "successful" and first["changed"]
        assert "--lr=2" in json.loads((tmp_path / "runs" / "r1" / "launch.json").read_text())["argv"]
        status, ev = _play(tmp_path, "restart_training.yml", {"run": "r1"}, check=True)
        assert status == "successful" and not module_result(ev)["changed"]
        status, ev = _play(tmp_path, "restart_training.yml", {"run": "r1"})
        again = module_result(ev)
        assert status == "successful" and not again["changed"] and again["pid"] == first["pid"]
        assert live_pids_with("--tag=pb-test") == [first["pid"]]
        status, ev = _play(tmp_path, "restart_training.yml", {"run": "r1", "force": True})
        forced = module_result(ev)
        assert forced["changed"] and forced["pid"] != first["pid"]
        status, ev = _play(tmp_path, "training_status.yml", {"run": "r1"})
        summary = [e["res"]["msg"] for e in ev if e["task"] == "Summarize"][0]
        assert "run r1: training (pid %d)" % forced["pid"] in summary and "heartbeat" in summary
        status, ev = _play(tmp_path, "stop_training.yml", {"run": "r1"})
        assert module_result(ev)["changed"] and live_pids_with("--tag=pb-test") == []
    finally:
        for pid in live_pids_with("--tag=pb-test"):
            os.kill(pid, 9)


@pytest.mark.parametrize("extravars,msg", [({}, "no run given: add -e run=NAME"),
                                           ({"run": "nope"}, "undeclared run nope: declared runs are r1 (dflash_runs); fix"),
                                           ({"run": "x;id"}, "invalid run name")])
def test_restart_playbook_refuses_bad_runs(tmp_path, extravars, msg):
    status, ev = _play(tmp_path, "restart_training.yml", extravars)
    assert status == "failed"
    assert any(msg in (e["res"].get("msg") or "") for e in ev)
    assert not (tmp_path / "runs").exists()


def test_a_templated_run_name_is_named_as_such_and_not_run(tmp_path):
    """-e run="{{ lookup('pipe', ...) }}": Ansible would template it into the lookup's output (empty here); the
    refusal says it is a template and points at the launcher, instead of "no run given", and the lookup never ran."""
    marker = tmp_path / "lookup-ran"
    status, ev = _play(tmp_path, "restart_training.yml", {"run": "{{ lookup('pipe', 'touch %s') }}" % marker})
    assert status == "failed"
    msg = [e["res"]["msg"] for e in ev if e["res"].get("bad_input")][0]
    assert msg.startswith("run \"{{ lookup('pipe', 'touch %s') }}\" is a template: Ansible templates -e values"
                          % marker), msg
    assert "python -m dflash_ops restart NAME" in msg and "no run given" not in msg
    assert not marker.exists() and not (tmp_path / "runs").exists()


def test_check_mode_creates_nothing_and_says_would_launch(tmp_path):
    status, ev = _play(tmp_path, "restart_training.yml", {"run": "r1"}, check=True)
    assert status == "successful" and module_result(ev)["changed"]
    summary = [e["res"]["msg"] for e in ev if e["task"] == "Summarize"][0]
    assert summary.startswith("run r1: would launch (check mode: nothing was changed)"), summary
    assert "launched" not in summary
    assert not (tmp_path / "runs").exists()  # no runs root, no lock file


@pytest.mark.parametrize("root", ["/", "/etc", "/var"])
def test_a_system_directory_as_runs_root_is_refused_before_anything_changes(tmp_path, root):
    status, ev = _play(tmp_path, "restart_training.yml", {"run": "r1", "dflash_runs_root": root})
    assert status == "failed"
    msg = module_result(ev)["msg"]
    assert msg == ("runs_root %s is a system directory; give the runs a directory of their own "
                   "(e.g. dflash_runs_root=/workspace/runs)" % root)
    assert not os.path.exists(os.path.join(root, "r1"))
    assert not os.path.exists(os.path.join(root, ".dflash-lifecycle.lock"))


def _summary(ev):
    return [e["res"]["msg"] for e in ev if e["task"] == "Summarize"][0]


@pytest.mark.parametrize("playbook", ["stop_training.yml", "training_status.yml"])
def test_an_undeclared_run_fails_listing_the_declared_ones(tmp_path, playbook):
    status, ev = _play(tmp_path, playbook, {"run": "r2"})
    assert status == "failed"
    assert any((e["res"].get("msg") or "").startswith("undeclared run r2: declared runs are r1 (dflash_runs)")
               for e in ev)


def test_stop_and_status_say_what_happened(tmp_path):
    try:
        status, ev = _play(tmp_path, "stop_training.yml", {"run": "r1"})
        assert status == "successful" and not module_result(ev)["changed"]
        assert _summary(ev) == "run r1: nothing to stop: not running (never launched)"
        status, ev = _play(tmp_path, "training_status.yml", {"run": "r1"})
        assert _summary(ev).startswith("run r1: not running (never launched)")
        status, ev = _play(tmp_path, "restart_training.yml", {"run": "r1"})
        assert status == "successful"
        status, ev = _play(tmp_path, "stop_training.yml", {"run": "r1"})
        assert status == "successful" and module_result(ev)["changed"]
        status, ev = _play(tmp_path, "training_status.yml", {"run": "r1"})
        first = _summary(ev).splitlines()[0]
        assert first.startswith("run r1: not running (stopped by SIGTERM at step ") and first.endswith(", checkpointed)")
        status, ev = _play(tmp_path, "stop_training.yml", {"run": "r1"})
        assert status == "successful" and not module_result(ev)["changed"]
        assert _summary(ev) == "run r1: nothing to stop: " + first[len("run r1: "):]
    finally:
        for pid in live_pids_with("--tag=pb-test"):
            os.kill(pid, 9)


@pytest.mark.parametrize("playbook,line", [("stop_training.yml", "run r1: nothing to stop: container stopped"),
                                           ("training_status.yml", "run r1: container stopped")])
def test_a_stopped_container_is_nothing_to_stop(tmp_path, playbook, line):
    pct = tmp_path / "pct"
    pct.write_text("#!/bin/sh\necho \"container '$2' not running!\" >&2\nexit 255\n")
    pct.chmod(0o755)
    status, ev = _play(tmp_path, playbook, {"run": "r1", "dflash_transport": "pct", "dflash_vmid": 201,
                                            "dflash_pct_path": str(pct)})
    assert status == "successful" and not module_result(ev)["changed"]
    assert _summary(ev).splitlines()[0] == line
