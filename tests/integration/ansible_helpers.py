"""Helpers: run dflash.ops modules through ansible-runner; look at the processes and files they leave."""
import json
import os
import sys
import threading

import ansible_runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The stand-in trainer shared with the container harness (fault switches: see its docstring).
FAKE = os.path.join(ROOT, "tests", "harness", "fake_trainer.py")
# Ansible.modules: the play, then one task a call
MODULE_PLAY = """---
- name: Module under test, several calls
  hosts: localhost
  gather_facts: false
  tasks:
"""
MODULE_TASK = """    - name: module under test %d
      %s:
      args: "{{ module_calls[%d] }}"
      check_mode: %s
      diff: %s
      ignore_errors: true
"""

BIN = os.path.dirname(sys.executable)
RUNNER_ENV = {"ANSIBLE_COLLECTIONS_PATH": os.path.join(ROOT, ".collections"),
              "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
              # ansible-playbook from the same virtual environment as this test run.
              "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}


def run_project_playbook(data_dir, playbook, inventory, extravars, check=False):
    """One of playbooks/ through ansible-runner: (status, [event_data of each ok or failed task result])."""
    os.makedirs(str(data_dir))
    r = ansible_runner.run(private_data_dir=str(data_dir), project_dir=os.path.join(ROOT, "playbooks"),
                           playbook=playbook, inventory=inventory, extravars=extravars, quiet=True,
                           cmdline="--check" if check else None, envvars=RUNNER_ENV)
    return r.status, [e["event_data"] for e in r.events if e.get("event") in ("runner_on_ok", "runner_on_failed")]


def module_result(events):
    """The training_run result among a restart/stop/status playbook's task results."""
    return [e["res"] for e in events if e["task"].startswith("Training run")][-1]


class Ansible(object):
    """Calls a module through a real ansible-playbook run: (ok, result) of each call."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.count = 0
        self.lock = threading.Lock()

    def module(self, name, args, check=False, diff=False):
        """One call of a module: (ok, result)."""
        return self.modules(name, [(args, check, diff)])[0]

    def modules(self, name, calls):
        """Several calls of one module as the tasks of one ansible-playbook run, in order (one start of Ansible, not
        one a call): calls are (args, check, diff); each task has check_mode and diff of its own and goes on after a
        failure (ignore_errors). [(ok, result)] in the calls' order."""
        with self.lock:
            self.count += 1
            data_dir = self.tmp / ("runner-%d" % self.count)
        (data_dir / "project").mkdir(parents=True)
        tasks = "".join(MODULE_TASK % (i, name, i, check, diff) for i, (_, check, diff) in enumerate(calls))
        (data_dir / "project" / "play.yml").write_text(MODULE_PLAY + tasks)
        r = ansible_runner.run(
            private_data_dir=str(data_dir), playbook="play.yml", quiet=True,
            extravars={"module_calls": [args for args, _, _ in calls]},
            envvars=dict(RUNNER_ENV, ANSIBLE_PYTHON_INTERPRETER=sys.executable),
            inventory="localhost ansible_connection=local",
            settings={"suppress_ansible_output": True},
        )
        by_task = dict((e["event_data"].get("task"), (e["event"] == "runner_on_ok", e["event_data"]["res"]))
                       for e in r.events if e.get("event") in ("runner_on_ok", "runner_on_failed"))
        results = [by_task.get("module under test %d" % i) for i in range(len(calls))]
        assert all(results), "no result from call %d of the module (runner status %s): %s" % (
            results.index(None), r.status, r.stdout.read()[-2000:])
        return results


def starts(run_dir):
    path = os.path.join(str(run_dir), "starts.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def live_pids_with(marker):
    """pids of live (non-zombie) processes whose command line contains marker."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            with open("/proc/%s/stat" % name) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            found.append(int(name))
    return found
