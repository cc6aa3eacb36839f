"""python -m dflash_ops (launcher/): each survey's answers replayed exactly as AWX passes them (strings; "no" is no
force; integers for integer questions) through ansible-runner in local mode with the stand-in trainer, asserted on
the runner's events and artifacts; live progress; failures exit 1 with the message and the log tail; two concurrent
launches end with one live run; operator input is data: a templated run name runs nothing, through the entry point
and through the survey (answers tagged !unsafe, as AWX does)."""
import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
import yaml
from ansible_helpers import FAKE, ROOT, live_pids_with, starts

from dflash_ops import extravars, launch, project as projects
from dflash_ops.errors import InputError
from jinja2.sandbox import ImmutableSandboxedEnvironment

pytestmark = pytest.mark.timeout(180)
PROJECT = projects.find_project(ROOT)
HOSTILE = "{{ lookup('pipe', 'touch %s') }}"  # at most 64 characters with a short path: the survey allows it


@pytest.fixture
def pwned():
    """A short path (so that the templated name passes the survey's length) that must never be created."""
    path = "/tmp/dfo-pwned-%d" % os.getpid()
    assert not os.path.exists(path)
    yield path
    if os.path.exists(path):
        os.remove(path)


@pytest.fixture
def inv(tmp_path, request):
    """A local inventory: the stand-in trainer (tagged per test), runs under tmp; its processes are killed after."""
    tag = "dfo-%s-%d" % (request.node.name[:40], os.getpid())
    src = tmp_path / "store" / "M"
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"vocab_size": 8}')
    (src / "model.safetensors").write_bytes(os.urandom(1 << 16))
    (tmp_path / "shm").mkdir()
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"dflash_training": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "dflash_transport": "local", "dflash_runs_root": str(tmp_path / "runs"), "dflash_trainer_command": [FAKE],
        "dflash_model_source": str(src), "dflash_model_dest": str(tmp_path / "shm" / "M"),
        "dflash_run_defaults": {"trainer_args": {"tag": tag},
                                "env": {"DFLASH_PROFILE_INTERVAL": "60", "DFLASH_SPLIT_FC_LAYERS": "0",
                                        "FAKE_SHOW_ENV": "DFLASH_PROFILE_INTERVAL,DFLASH_SPLIT_FC_LAYERS",
                                        "FAKE_HASH_ENV": "WANDB_API_KEY"}},
        "dflash_runs": {"r1": {"trainer_args": {"lr": 2}}, "r2": {}}}}}}))
    inv = type("Inv", (), {"path": str(path), "tag": tag, "runs": tmp_path / "runs", "tmp": tmp_path})
    yield inv
    for pid in live_pids_with("--tag=" + tag):
        os.kill(pid, signal.SIGKILL)


def cli(inv, *args, artifacts=None):
    """The entry point as an operator types it: (rc, stdout, stderr)."""
    argv = [sys.executable, "-m", "dflash_ops"] + list(args) + ["-i", inv.path]
    if artifacts:
        argv += ["--artifacts", str(artifacts)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    return proc.returncode, proc.stdout, proc.stderr


def replay(inv, template, answers, name, check_run_name=True):
    """The answers exactly as AWX hands them over, through `launch TEMPLATE --answers JSON`; returns (rc, events,
    artifacts dir, stderr)."""
    data_dir = inv.tmp / name
    rc, out, err = cli(inv, "launch", template, "--answers", json.dumps(answers), artifacts=data_dir)
    arts = glob.glob(str(data_dir / "artifacts" / "*"))
    events = []
    for path in sorted(glob.glob(os.path.join(arts[0], "job_events", "*.json")) if arts else [],
                       key=lambda p: int(os.path.basename(p).split("-")[0])):
        with open(path) as f:
            events.append(json.load(f))
    return rc, events, arts[0] if arts else None, out + err


def training_result(events):
    return [e["event_data"]["res"] for e in events if e.get("event") in ("runner_on_ok", "runner_on_failed")
            and e["event_data"]["task"].startswith("Training run")][-1]


def artifact(arts, name):
    with open(os.path.join(arts, name)) as f:
        return f.read().strip()


def test_restart_survey_answers_as_awx_sends_them(inv):
    rc, ev, arts, out = replay(inv, "Restart training", {"run": "r1", "force": "no"}, "j1")
    first = training_result(ev)
    assert rc == 0 and artifact(arts, "status") == "successful" and artifact(arts, "rc") == "0", out
    assert first["changed"] and first["action"] == "launched"
    # "no" is no force: the same configuration alive is left alone.
    rc, ev, arts, out = replay(inv, "Restart training", {"run": "r1", "force": "no"}, "j2")
    again = training_result(ev)
    assert rc == 0 and not again["changed"] and again["pid"] == first["pid"]
    # "yes" forces a new launch.
    rc, ev, arts, out = replay(inv, "Restart training", {"run": "r1", "force": "yes"}, "j3")
    forced = training_result(ev)
    assert rc == 0 and forced["changed"] and forced["pid"] != first["pid"]
    assert live_pids_with("--tag=" + inv.tag) == [forced["pid"]]


def test_profile_interval_and_split_fc_answers_reach_the_run_env_only_when_given(inv):
    rc, ev, arts, out = replay(inv, "Restart training", {"run": "r1", "force": "no", "profile_interval": 7,
                                                         "split_fc_layers": "1"}, "j1")
    assert rc == 0, out
    assert starts(inv.runs / "r1")[-1]["env"] == {"DFLASH_PROFILE_INTERVAL": "7", "DFLASH_SPLIT_FC_LAYERS": "1"}
    assert "--lr=2" in starts(inv.runs / "r1")[-1]["argv"]  # the run's own configuration is kept
    # Unanswered (AWX sends nothing for an empty optional question): the inventory's values, so a new config.
    rc, ev, arts, out = replay(inv, "Restart training", {"run": "r1", "force": "no"}, "j2")
    assert rc == 0 and training_result(ev)["changed"], out
    assert starts(inv.runs / "r1")[-1]["env"] == {"DFLASH_PROFILE_INTERVAL": "60", "DFLASH_SPLIT_FC_LAYERS": "0"}
    assert len(live_pids_with("--tag=" + inv.tag)) == 1


@pytest.mark.parametrize("answers,needle", [
    ({"run": "r1", "force": True}, "Value True for 'force' expected to be one of ['no', 'yes']"),
    ({"run": "r1", "force": "false"}, "expected to be one of ['no', 'yes']"),
    ({"run": "r1", "profile_interval": "7"}, "Value '7' for 'profile_interval' expected to be an integer"),
    ({"run": "r1", "split_fc_layers": "2"}, "expected to be one of ['0', '1']"),
    ({"force": "no"}, "'run' value missing"),
    ({"run": "x" * 65}, "is too large (must be no more than 64)"),
    ({"run": "r1", "dflash_runs_root": "/"}, "Restart training does not ask dflash_runs_root"),
])
def test_answers_awx_would_refuse_are_refused_before_anything_runs(inv, answers, needle):
    rc, ev, arts, out = replay(inv, "Restart training", answers, "j")
    assert rc == 2 and needle in out and arts is None and not inv.runs.exists(), out
    assert len(out.strip().splitlines()) == 1


def test_stop_and_status_survey_answers(inv):
    assert replay(inv, "Restart training", {"run": "r2", "force": "no"}, "j1")[0] == 0
    rc, ev, arts, out = replay(inv, "Training status", {"run": "r2"}, "j2")
    assert rc == 0 and training_result(ev)["alive"] and "run r2: training (pid" in out
    rc, ev, arts, out = replay(inv, "Stop training", {"run": "r2"}, "j3")
    assert rc == 0 and training_result(ev)["changed"] and live_pids_with("--tag=" + inv.tag) == []


def test_stage_weights_survey_answers(inv):
    rc, ev, arts, out = replay(inv, "Stage weights", {"verify": "size", "force": "no"}, "j1")
    assert rc == 0 and artifact(arts, "status") == "successful", out
    assert (inv.tmp / "shm" / "M" / "model.safetensors").read_bytes() == \
        (inv.tmp / "store" / "M" / "model.safetensors").read_bytes()
    rc, ev, arts, out = replay(inv, "Stage weights", {"verify": "full", "force": "no"}, "j2")
    staged = [e["event_data"]["res"] for e in ev if e.get("event") == "runner_on_ok"  # the job's, then its polls'
              and e["event_data"].get("task", "").startswith("Model weights ")]
    assert rc == 0 and staged and not staged[-1]["changed"], out


def test_progress_is_printed_per_task_while_the_job_runs(inv):
    proc = subprocess.Popen([sys.executable, "-m", "dflash_ops", "restart", "r1", "-i", inv.path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    seen_running = []
    for line in proc.stdout:
        if line.strip() == "TASK Training run r1: restarted":
            seen_running.append(proc.poll() is None)  # printed when the task starts, not at the end
    assert proc.wait() == 0 and seen_running == [True]


def test_a_failed_job_exits_1_with_the_message_and_the_log_tail_and_bad_input_2(inv):
    runs = json.loads(open(inv.path).read())
    host = runs["dflash_training"]["hosts"]["localhost"]
    host["dflash_runs"]["crash"] = {"trainer_args": {"crash": 3}}
    open(inv.path, "w").write(json.dumps(runs))
    rc, out, err = cli(inv, "restart", "crash")
    assert rc == 1, out + err
    assert err.startswith("dflash_ops: Training run crash: restarted failed on localhost: ")
    assert "| fake_trainer pid=" in err  # the run's log tail
    rc, out, err = cli(inv, "stop", "nope")  # bad input, found by the playbook's check of the inputs: exit 2
    assert rc == 2 and "undeclared run nope: declared runs are crash, r1, r2" in err, out + err


def test_two_concurrent_launches_end_with_one_live_run(inv):
    results = []

    def one(i):
        results.append(cli(inv, "restart", "r1", "--force"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r[0] for r in results] == [0, 0], results
    pids = live_pids_with("--tag=" + inv.tag)
    assert len(pids) == 1 and len(starts(inv.runs / "r1")) == 2  # the later launch stopped the earlier one
    assert int((inv.runs / "r1" / "pid").read_text()) == pids[0]


def test_a_templated_run_name_is_refused_by_the_entry_point_with_nothing_run(inv, pwned):
    assert len(HOSTILE % pwned) <= 64
    data_dir = inv.tmp / "job"
    rc, out, err = cli(inv, "restart", HOSTILE % pwned, artifacts=data_dir)
    assert rc == 2 and err.startswith("dflash_ops: invalid run name ") and err.strip().endswith("nothing was run")
    assert not data_dir.exists() and not os.path.exists(pwned) and not inv.runs.exists()


def test_a_templated_survey_answer_is_data_not_a_template(inv, pwned):
    """Without the entry point's own check (as in AWX): the answer reaches the playbook !unsafe, and the training
    inputs' check refuses it as a template; the lookup never runs."""
    template = projects.template(PROJECT, "Restart training")
    data_dir = launch.prepare(PROJECT, template, {"run": HOSTILE % pwned, "force": "no"},
                              data_dir=str(inv.tmp / "job"), check_run_name=False)
    outcome = launch.run(PROJECT, template, data_dir, inventory=inv.path, out=open(os.devnull, "w"))
    msg = outcome.failure["res"]["msg"]
    assert outcome.status == "failed" and "is a template" in msg and "nothing was run" in msg, msg
    assert not os.path.exists(pwned) and not inv.runs.exists()


def test_the_same_value_as_a_trusted_extra_var_is_refused_before_it_is_templated(inv, pwned):
    """The same value written untagged (as a template's own extra var, which Ansible would template): the training
    inputs read the run name as given and refuse a template before Ansible renders it (issue 37), so the lookup
    does not run either."""
    template = projects.template(PROJECT, "Training status")
    data_dir = launch.prepare(PROJECT, template, {"run": "r1"}, data_dir=str(inv.tmp / "job"))
    with open(os.path.join(data_dir, "env", "extravars"), "w") as f:
        f.write(extravars.render({"run": HOSTILE % pwned}, {}))
    outcome = launch.run(PROJECT, template, data_dir, inventory=inv.path, out=open(os.devnull, "w"))
    assert outcome.status == "failed" and "is a template" in outcome.failure["res"]["msg"]
    assert not os.path.exists(pwned)


def test_bad_input_is_one_line_before_anything_runs(inv, tmp_path):
    rc, out, err = cli(inv, "launch", "Reboot everything")
    assert rc == 2 and err.startswith("dflash_ops: no job template 'Reboot everything' in awx/job_templates")
    proc = subprocess.run([sys.executable, "-m", "dflash_ops", "status", "r1", "-i", str(tmp_path / "no")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr == "dflash_ops: inventory %s does not exist; give -i an inventory " \
        "file or directory\n" % (tmp_path / "no")
    used = tmp_path / "used"
    assert cli(inv, "status", "r1", artifacts=used)[0] == 0
    rc, out, err = cli(inv, "status", "r1", artifacts=used)
    assert rc == 2 and err == "dflash_ops: %s already holds a job; give --artifacts a new directory\n" % used
    with pytest.raises(InputError, match="not a dflash.ops checkout"):
        projects.find_project(str(tmp_path))


def _inject(node, inputs):
    """A credential type's extra_vars injector rendered as AWX renders it (sandboxed Jinja over nested values)."""
    if isinstance(node, dict):
        return {k: _inject(v, inputs) for k, v in node.items()}
    return ImmutableSandboxedEnvironment().from_string(node).render(**inputs)


def test_the_secrets_credential_reaches_the_trainer_and_no_job_event(inv):
    secret = "wandb-Secret-5c1e"
    with open(os.path.join(ROOT, "awx", "controller.yml")) as f:
        injectors = yaml.safe_load(f)["credential_type"]["injectors"]
    injected = _inject(injectors["extra_vars"], {"wandb_api_key": secret})
    template = projects.template(PROJECT, "Restart training")
    data_dir = launch.prepare(PROJECT, template, {"run": "r1", "force": "no"}, data_dir=str(inv.tmp / "job"))
    with open(os.path.join(data_dir, "env", "extravars"), "w") as f:  # AWX: template vars + credential + answers
        f.write(extravars.render(template.extra_vars, dict(injected, run="r1", force="no")))
    outcome = launch.run(PROJECT, template, data_dir, inventory=inv.path, out=open(os.devnull, "w"))
    assert outcome.ok
    seen = starts(inv.runs / "r1")[-1]
    assert seen["secret_sha"]["WANDB_API_KEY"] == hashlib.sha256(secret.encode()).hexdigest()
    for path in glob.glob(os.path.join(outcome.artifacts, "**", "*"), recursive=True) + \
            glob.glob(str(inv.runs / "r1" / "*")):
        if os.path.isfile(path):
            assert secret not in open(path, errors="replace").read(), path


def test_a_restart_preview_shows_the_diff_and_changes_nothing(inv):
    assert cli(inv, "restart", "r1")[0] == 0
    pid = (inv.runs / "r1" / "pid").read_text()
    launch_json = (inv.runs / "r1" / "launch.json").read_text()
    rc, out, err = cli(inv, "restart", "r1", "--profile-interval", "30", "--check")  # a changed configuration
    assert rc == 0, out + err
    assert out.startswith("Preview restart: playbooks/restart_training.yml (")
    assert "      diff run r1: \n" in out and "        fingerprint: " in out, out
    assert '"DFLASH_PROFILE_INTERVAL": "60"' in out and '"DFLASH_PROFILE_INTERVAL": "30"' in out, out
    assert (inv.runs / "r1" / "pid").read_text() == pid and len(starts(inv.runs / "r1")) == 1
    assert (inv.runs / "r1" / "launch.json").read_text() == launch_json
    rc, out, err = cli(inv, "restart", "r1", "--check")
    assert rc == 0 and "      diff run r1: no change" in out, out + err


def test_a_configuration_the_trainer_refuses_exits_2_through_the_entry_point_and_the_preview(inv):
    runs = json.loads(open(inv.path).read())
    runs["dflash_training"]["hosts"]["localhost"]["dflash_runs"]["typo"] = {
        "trainer_args": {"refuse_check": "unrecognized argument --blok-size=8"}}
    open(inv.path, "w").write(json.dumps(runs))
    for preview in ([], ["--check"]):
        rc, out, err = cli(inv, "restart", "typo", *preview)
        assert rc == 2, out + err
        assert ("the trainer's check refused this configuration, so nothing was stopped: unrecognized argument "
                "--blok-size=8") in err
    assert not (inv.runs / "typo").exists()
