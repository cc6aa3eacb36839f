"""Launch one job template of awx/ through ansible-runner, as AWX does: its playbook from the project directory, its
extra_vars, the survey answers checked by AWX's rules and passed !unsafe."""
import os
import sys
import tempfile

import ansible_runner

from dflash_ops import extravars, project as projects
from dflash_ops.errors import InputError
from dflash_ops.progress import Progress
from dflash_ops.survey import resolve_answers

LOG_TAIL_LINES = 20


class Outcome(object):
    def __init__(self, status, rc, artifacts, failure):
        self.status, self.rc, self.artifacts, self.failure = status, rc, artifacts, failure

    @property
    def ok(self):
        return self.status == "successful"


def prepare(project, template, answers, data_dir=None, check_run_name=True):
    """Everything before anything runs: answers checked (AWX's survey rules, then the collection's run-name rule),
    the private data directory with env/extravars written. Raises InputError; returns the directory."""
    resolved = resolve_answers(template, answers)
    if check_run_name and "run" in resolved:
        try:
            projects.run_name_rule(project)(resolved["run"])
        except ValueError as e:
            raise InputError("%s; nothing was run" % e)
    if data_dir and os.path.exists(os.path.join(data_dir, "env", "extravars")):
        raise InputError("%s already holds a job; give --artifacts a new directory" % data_dir)
    data_dir = data_dir or tempfile.mkdtemp(prefix="dflash_ops-")
    os.makedirs(os.path.join(data_dir, "env"), exist_ok=True)
    with open(os.path.join(data_dir, "env", "extravars"), "x") as f:
        f.write(extravars.render(template.extra_vars, resolved))
    return data_dir


def run(project, template, data_dir, inventory=None, out=None):
    """Run the prepared job; progress goes to out as it happens."""
    progress = Progress(out)
    env = {"ANSIBLE_CONFIG": str(project / "ansible.cfg"),  # resolves dflash.ops.* from the checkout, as in AWX
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    r = ansible_runner.run(private_data_dir=data_dir, project_dir=str(project), playbook=template.playbook,
                           inventory=inventory, envvars=env, quiet=True, event_handler=progress,
                           cmdline=template.cmdline or None)
    return Outcome(r.status, r.rc, r.config.artifact_dir, progress.failure)


def bad_input(outcome):
    """Did the job fail on bad input (dflash.ops.training_inputs, or the trainer's check of the configuration)?
    Nothing was changed then: exit status 2, as for answers refused before anything runs."""
    return bool(((outcome.failure or {}).get("res") or {}).get("bad_input"))


def failure_report(outcome):
    """The failing task's message and the run's log tail (training_run returns it), else ansible's last output."""
    if outcome.failure:
        res = outcome.failure.get("res") or {}
        lines = ["%s failed on %s: %s" % (outcome.failure.get("task"), outcome.failure.get("host"),
                                          res.get("msg", "(no message)"))]
        tail = res.get("log_tail") or []
        if tail:
            lines.append("log tail:")
            lines += ["  | " + line for line in tail[-LOG_TAIL_LINES:]]
        return lines
    stdout = os.path.join(outcome.artifacts, "stdout")
    text = open(stdout, errors="replace").read() if os.path.exists(stdout) else ""
    return ["job %s (rc %s) without a failed task; ansible's last output:" % (outcome.status, outcome.rc)] + [
        "  | " + line for line in text.strip().splitlines()[-LOG_TAIL_LINES:]]
