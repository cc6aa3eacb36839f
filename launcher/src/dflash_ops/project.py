"""The project (a checkout of dflash.ops): its job templates and surveys (awx/), and the collection's run-name rule."""
import importlib.util
import os
from pathlib import Path

import yaml

from dflash_ops.errors import InputError

TEMPLATES_DIR = "awx/job_templates"
SURVEYS_DIR = "awx/surveys"
RUN_NAME_RULE = "plugins/module_utils/_dflash/container/run_name.py"
# This file in a checkout: <project>/launcher/src/dflash_ops/project.py (also an editable install's).
_CHECKOUT = Path(__file__).resolve().parents[3]


def _is_project(path):
    return (path / TEMPLATES_DIR).is_dir() and (path / "playbooks").is_dir()


def find_project(explicit=None):
    """--project, else $DFLASH_OPS_PROJECT, else the current directory, else the checkout holding this package."""
    if explicit or os.environ.get("DFLASH_OPS_PROJECT"):
        path = Path(explicit or os.environ["DFLASH_OPS_PROJECT"]).resolve()
        if not _is_project(path):
            raise InputError("%s is not a dflash.ops checkout (no %s or playbooks/); give --project the checkout's root"
                             % (path, TEMPLATES_DIR))
        return path
    for path in (Path.cwd(), _CHECKOUT):
        if _is_project(path):
            return path
    raise InputError("no dflash.ops checkout here: run from the checkout's root, or pass --project DIR "
                     "(or set DFLASH_OPS_PROJECT)")


def _load(path):
    with open(path) as f:
        return yaml.safe_load(f)


class Template(object):
    """One job template of awx/job_templates/ and its survey (awx/surveys/ file of the same name), as AWX holds them."""

    def __init__(self, project, file_name):
        self.fields = _load(project / TEMPLATES_DIR / file_name)
        survey = project / SURVEYS_DIR / file_name
        self.survey = _load(survey) if survey.exists() and self.fields.get("survey_enabled") else None

    @property
    def name(self):
        return self.fields["name"]

    @property
    def playbook(self):
        return self.fields["playbook"]

    @property
    def extra_vars(self):
        return self.fields.get("extra_vars") or {}

    @property
    def cmdline(self):
        """ansible-playbook options AWX adds for the template: --check for job type check, --diff for diff mode."""
        return " ".join((["--check"] if self.fields.get("job_type") == "check" else [])
                        + (["--diff"] if self.fields.get("diff_mode") else []))

    @property
    def questions(self):
        return self.survey["spec"] if self.survey else []


def templates(project):
    """{name: Template} of every file in awx/job_templates/."""
    found = {}
    for path in sorted((project / TEMPLATES_DIR).glob("*.yml")):
        template = Template(project, path.name)
        found[template.name] = template
    return found


def template(project, name):
    found = templates(project)
    if name not in found:
        raise InputError("no job template %r in %s: the templates are %s" % (name, TEMPLATES_DIR, ", ".join(sorted(found))))
    return found[name]


def run_name_rule(project):
    """The collection's own run-name check (stdlib only), loaded from the project: one rule, not a copy."""
    spec = importlib.util.spec_from_file_location("_dflash_run_name", str(project / RUN_NAME_RULE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.validate_run_name
