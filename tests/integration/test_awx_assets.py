"""awx/ as code: configure.yml passes --syntax-check with the real awx.awx (from the pinned `ansible` wheel), and
runs green against a stand-in awx.awx whose modules check their arguments with the real modules' argument specs
(AWX itself cannot run here); every survey passes AWX's survey rules; templates keep one job per container."""
import json
import os
import re
import subprocess
import sys

import ansible_runner
import pytest
import yaml
from ansible_helpers import BIN, ROOT
from awx_collection import argument_specs, awx_collection_path

from dflash_ops import survey as surveys

pytestmark = pytest.mark.timeout(300)
AWX = os.path.join(ROOT, "awx")
TEMPLATES = sorted(os.listdir(os.path.join(AWX, "job_templates")))
SURVEYS = sorted(os.listdir(os.path.join(AWX, "surveys")))
CONFIGURE = os.path.join(AWX, "configure.yml")
STANDIN = '''#!/usr/bin/python
# Stand-in for awx.awx.%(name)s: the real module's argument spec and checks, no AWX server behind it.
import json
from ansible.module_utils.basic import AnsibleModule
SPEC = json.loads(%(spec)r)
module = AnsibleModule(argument_spec=SPEC["argument_spec"], supports_check_mode=True, **SPEC["kwargs"])
module.exit_json(changed=False, params=dict((k, v) for k, v in module.params.items() if v is not None))
'''


def _yaml(*parts):
    with open(os.path.join(AWX, *parts)) as f:
        return yaml.safe_load(f)


def _modules_used():
    with open(CONFIGURE) as f:
        return set(re.findall(r"^\s+awx\.awx\.([a-z_]+):", f.read(), re.M))


def test_configure_passes_syntax_check_with_awx_awx_and_needs_it(tmp_path):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=awx_collection_path(), ANSIBLE_CONFIG="",
               PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    check = [os.path.join(BIN, "ansible-playbook"), "--syntax-check", "-i", "localhost,", CONFIGURE]
    proc = subprocess.run(check, env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    # Without the collection the same check fails: it is awx.awx that resolves the tasks.
    env["ANSIBLE_COLLECTIONS_PATH"] = str(tmp_path)
    proc = subprocess.run(check, env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode != 0 and "awx.awx" in proc.stderr


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """A collections path whose awx.awx modules validate with the real argument specs and return their params."""
    root = tmp_path_factory.mktemp("standin")
    modules = root / "ansible_collections" / "awx" / "awx" / "plugins" / "modules"
    modules.mkdir(parents=True)
    for name, spec in argument_specs(_modules_used()).items():
        (modules / (name + ".py")).write_text(STANDIN % {"name": name, "spec": json.dumps(spec)})
    return str(root)


def _configure(data_dir, standin, project=AWX, **extravars):
    os.makedirs(str(data_dir), exist_ok=True)
    r = ansible_runner.run(
        private_data_dir=str(data_dir), project_dir=str(project), playbook="configure.yml", inventory="localhost",
        extravars=dict(extravars, ansible_python_interpreter=sys.executable), quiet=True,
        envvars={"ANSIBLE_COLLECTIONS_PATH": standin, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")})
    calls = {}
    for e in r.events:
        if e.get("event") in ("runner_on_ok", "runner_on_failed") and "res" in e["event_data"]:
            d = e["event_data"]
            results = d["res"].get("results") or [d["res"]]
            calls.setdefault(d["task_action"], []).extend(x.get("params") or x for x in results)
    return r.status, calls


def test_configure_gives_every_awx_module_arguments_it_accepts(tmp_path, standin):
    status, calls = _configure(tmp_path, standin, dflash_awx_scm_url="https://git.example.org/dflash.ops.git",
                               dflash_awx_ee_image="registry.example.org/dflash-ee:0.1.0",
                               dflash_awx_machine_credential="proxmox root", dflash_awx_wandb_api_key="k-123")
    failed = {a: c for a, c in calls.items() if any(x.get("failed") for x in c)}
    assert status == "successful" and not failed, failed
    templates = {t["name"]: t for t in calls["awx.awx.job_template"]}
    assert sorted(templates) == ["Install trainer", "Preview restart", "Provision", "Restart training",
                                 "Stage weights", "Stop training", "Training status"]
    assert all(t["allow_simultaneous"] is False for t in templates.values())
    # the preview: Restart training's playbook and survey, as a check job with its diff
    preview = templates["Preview restart"]
    assert (preview["job_type"], preview["diff_mode"], preview["playbook"]) == ("check", True,
                                                                                 "playbooks/restart_training.yml")
    assert preview["survey_spec"] == _yaml("surveys", "restart_training.yml")
    restart = templates["Restart training"]
    assert restart["credentials"] == ["proxmox root", "dflash training secrets"]
    assert restart["survey_enabled"] and restart["survey_spec"] == _yaml("surveys", "restart_training.yml")
    # The template's own extra_vars reach AWX as written (AWX templates them at launch), not rendered here.
    assert restart["extra_vars"]["training_runs"].startswith("{{ dflash_runs")
    assert restart["execution_environment"] == "dflash.ops"
    (ctype,) = calls["awx.awx.credential_type"]
    assert ctype["injectors"] == {"extra_vars": {"dflash_secret_env": {"WANDB_API_KEY": "{{ wandb_api_key }}"}}}
    assert ctype["kind"] == "cloud" and [f["id"] for f in ctype["inputs"]["fields"]] == ["wandb_api_key"]
    (project,) = calls["awx.awx.project"]
    assert project["scm_url"] == "https://git.example.org/dflash.ops.git"
    assert calls["awx.awx.inventory_source"][0]["source_path"] == "inventories/example"
    assert len(calls["awx.awx.credential"]) == 1


def test_configure_without_a_key_leaves_the_secrets_credential_out(tmp_path, standin):
    status, calls = _configure(tmp_path, standin, dflash_awx_scm_url="https://git.example.org/dflash.ops.git")
    assert status == "successful"
    templates = {t["name"]: t for t in calls["awx.awx.job_template"]}
    assert templates["Restart training"]["credentials"] == []
    assert "awx.awx.credential" not in calls or all(c.get("skipped") for c in calls["awx.awx.credential"])


def test_configure_refuses_without_a_project_url(tmp_path, standin):
    status, calls = _configure(tmp_path, standin)
    assert status == "failed"
    assert "no project URL: add -e dflash_awx_scm_url=" in calls["ansible.builtin.assert"][0]["msg"]


def test_the_standin_refuses_a_field_awx_awx_does_not_know(tmp_path, standin):
    """The check above can fail: a template field awx.awx.job_template does not accept is refused."""
    awx = tmp_path / "awx"
    subprocess.run(["cp", "-r", AWX, str(awx)], check=True)
    bad = awx / "job_templates" / "stop_training.yml"
    bad.write_text(bad.read_text() + "concurrent_runs: false\n")
    status, calls = _configure(tmp_path / "pd", standin, project=awx, dflash_awx_scm_url="u")
    msgs = [c.get("msg", "") for c in calls["awx.awx.job_template"] if c.get("failed")]
    assert status == "failed" and any("concurrent_runs" in m for m in msgs), msgs


@pytest.mark.parametrize("name", SURVEYS)
def test_every_survey_passes_awx_survey_rules(name):
    assert surveys.spec_errors(_yaml("surveys", name)) == []


@pytest.mark.parametrize("survey,needle", [
    ({"name": "s", "description": "", "spec": []}, "doesn't contain any items"),
    ({"name": "s", "description": "", "spec": [{"question_name": "q", "variable": "v", "type": "boolean",
                                                "required": True}]}, "type 'boolean' is not one of"),
    ({"name": "s", "description": "", "spec": [{"question_name": "q", "variable": "v", "type": "multiplechoice",
                                                "required": True, "default": "maybe", "choices": ["no", "yes"]}]},
     "default must be one of the choices"),
    ({"name": "s", "description": "", "spec": [{"question_name": "q", "variable": "v", "type": "text",
                                                "required": "yes"}]}, "'required' has the wrong type"),
    ({"name": "s", "description": "", "spec": [{"question_name": "q", "variable": "v", "type": "text",
                                                "required": True, "regex": ".*"}]}, "unknown field 'regex'"),
])
def test_the_survey_rules_refuse_what_awx_refuses(survey, needle):
    assert any(needle in e for e in surveys.spec_errors(survey)), surveys.spec_errors(survey)


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_template_runs_a_playbook_of_the_project_and_its_survey_is_there(name):
    template = _yaml("job_templates", name)
    assert os.path.isfile(os.path.join(ROOT, template["playbook"]))
    assert template["allow_simultaneous"] is False
    assert bool(template.get("survey_enabled")) == (name in SURVEYS)


def test_yes_no_questions_are_multiple_choice_no_yes():
    force = [q for n in SURVEYS for q in _yaml("surveys", n)["spec"] if q["variable"] == "force"]
    assert len(force) == 3 and all(q["type"] == "multiplechoice" and q["choices"] == ["no", "yes"]
                                   and q["default"] == "no" for q in force)
