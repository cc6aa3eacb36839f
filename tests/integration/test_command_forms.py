"""The commands operators type, verbatim, through ansible-playbook as a subprocess (issue 20, item 7):
`ansible-playbook restart_training.yml -e run=NAME` from playbooks/, `ansible-playbook dflash.ops.<playbook>` from
the root and from playbooks/, both with no ANSIBLE_CONFIG (the ansible.cfg found in the working directory and the
default inventory it names); and a play whose group has no host fails naming the inventory instead of exit 0."""
import json
import os
import subprocess

import pytest
from ansible_helpers import BIN, FAKE, ROOT, live_pids_with

PLAYBOOKS = os.path.join(ROOT, "playbooks")
# No ANSIBLE_CONFIG, no ANSIBLE_COLLECTIONS_PATH, no ANSIBLE_INVENTORY: only what a shell in the checkout has.
ENV = dict((k, v) for k, v in os.environ.items() if not k.startswith("ANSIBLE_"))
ENV["PATH"] = BIN + os.pathsep + os.environ.get("PATH", "")


def _playbook(cwd, *args):
    return subprocess.run([os.path.join(BIN, "ansible-playbook")] + list(args), cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300)


def _config(cwd):
    proc = subprocess.run([os.path.join(BIN, "ansible-config"), "dump", "--only-changed", "--format", "json"],
                          cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return dict((item["name"], item["value"]) for item in json.loads(proc.stdout) if "name" in item)


def test_playbooks_dir_resolves_the_same_configuration_as_the_root():
    root, here = _config(ROOT), _config(PLAYBOOKS)
    for key in ("COLLECTIONS_PATHS", "DEFAULT_HOST_LIST"):
        assert [os.path.realpath(p) for p in here[key]] == [os.path.realpath(p) for p in root[key]], key
    assert os.path.realpath(here["DEFAULT_HOST_LIST"][0]) == os.path.join(ROOT, "inventories", "local")
    # One source of truth: playbooks/ansible.cfg is the root's file.
    assert os.path.realpath(os.path.join(PLAYBOOKS, "ansible.cfg")) == os.path.join(ROOT, "ansible.cfg")


@pytest.mark.slow
def test_the_forms_operators_type(tmp_path):
    # The default inventory (inventories/local) with the runs root and trainer pointed at the test's own.
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({
        "dflash_runs_root": str(tmp_path / "runs"), "dflash_trainer_command": [FAKE],
        "dflash_run_defaults": {"trainer_args": {"tag": "forms-test"}}, "dflash_runs": {"forms": {}},
        "training_expect_trainer_version": ""}))
    try:
        proc = _playbook(PLAYBOOKS, "restart_training.yml", "-e", "run=forms", "-e", "@%s" % extra)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "run forms: launched pid" in proc.stdout
        pids = live_pids_with("--tag=forms-test")
        assert len(pids) == 1
        proc = _playbook(PLAYBOOKS, "dflash.ops.training_status", "-e", "run=forms", "-e", "@%s" % extra)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "run forms: training (pid %d)" % pids[0] in proc.stdout
        proc = _playbook(ROOT, "dflash.ops.restart_training", "-e", "run=forms", "-e", "@%s" % extra)
        assert proc.returncode == 0 and "run forms: noop pid %d" % pids[0] in proc.stdout, proc.stdout[-3000:]
        proc = _playbook(ROOT, "dflash.ops.stop_training", "-e", "run=forms", "-e", "@%s" % extra)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert live_pids_with("--tag=forms-test") == []
    finally:
        for pid in live_pids_with("--tag=forms-test"):
            os.kill(pid, 9)


@pytest.mark.parametrize("cwd,playbook", [(PLAYBOOKS, "restart_training.yml"), (ROOT, "dflash.ops.stop_training"),
                                          (ROOT, "playbooks/training_status.yml")])
def test_a_group_without_hosts_fails_naming_the_inventory(tmp_path, cwd, playbook):
    inventory = tmp_path / "empty.yml"
    inventory.write_text("---\nother:\n  hosts:\n    elsewhere:\n")
    proc = _playbook(cwd, "-i", str(inventory), playbook, "-e", "run=demo")
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "no host in group dflash_training in the inventory used (%s;" % inventory in out, proc.stdout[-2000:]
    assert "configuration %s" % os.path.join(cwd, "ansible.cfg") in out
    assert "Training run" not in proc.stdout
