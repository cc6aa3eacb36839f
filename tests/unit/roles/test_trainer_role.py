"""The trainer role: defaults/main.yml and argument_specs.yml name the same trainer_* variables; every default that
mirrors a trainer_install option equals the module's argument spec (the one place a default lives); the trainer's
pins are chosen in one place (trainer/requirements.txt) and the test environment and the harness follow them; the
training role expects the version trainer/pyproject.toml declares."""
import os
import re
import sys

import jinja2
import pytest
import yaml

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.trainer_install_backend import argument_spec

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ROLE = os.path.join(REPO, "roles", "trainer")
# Role variables that differ from the module option of the same name on purpose.
ON_PURPOSE = {
    "trainer_wheelhouse": "the role also accepts a controller wheelhouse, staged on the host and passed here",
}


def load(*parts):
    with open(os.path.join(*parts)) as f:
        return yaml.safe_load(f)


DEFAULTS = load(ROLE, "defaults", "main.yml")
SPEC = load(ROLE, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
MODULE = argument_spec().argument_spec
COERCE = {"float": float, "int": int, "bool": bool, "str": str, "path": str, "list": list, "dict": dict}


def rendered_default(value):
    if not isinstance(value, str) or "{{" not in value:
        return value
    text = jinja2.Environment().from_string(value).render(omit="__omit__")
    return yaml.safe_load(text) if text else text


def shared_options():
    return [(var, var[len("trainer_"):]) for var in sorted(SPEC)
            if var[len("trainer_"):] in MODULE and var not in ON_PURPOSE]


def test_defaults_and_argument_specs_name_the_same_prefixed_variables():
    assert set(DEFAULTS) == set(SPEC)
    assert all(name.startswith("trainer_") for name in DEFAULTS)


def test_the_comparison_covers_the_install_options():
    assert {"venvs_root", "link", "keep", "pip_timeout", "transport", "pct_path", "container_wheelhouse",
            "index_url"} <= set(opt for _, opt in shared_options())


@pytest.mark.parametrize("var,option", shared_options())
def test_role_default_equals_the_module_default(var, option):
    module_default = MODULE[option].get("default")
    kind = COERCE[MODULE[option]["type"]]
    if "default" in SPEC[var]:
        assert kind(SPEC[var]["default"]) == module_default, "%s in argument_specs.yml" % var
    resolved = rendered_default(DEFAULTS[var])
    if resolved == "__omit__":
        return  # the module's own default applies
    assert kind(resolved) == module_default, "%s in defaults/main.yml resolves to %r" % (var, resolved)


@pytest.mark.parametrize("var,option", shared_options())
def test_role_types_and_choices_follow_the_module(var, option):
    assert SPEC[var]["type"] == {"path": "str"}.get(MODULE[option]["type"], MODULE[option]["type"]), var
    assert sorted(SPEC[var].get("choices") or []) == sorted(MODULE[option].get("choices") or []), var


def _requirement_lines(path):
    with open(path) as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def test_the_trainer_pins_are_chosen_once_and_followed():
    pins = _requirement_lines(os.path.join(REPO, "trainer", "requirements.txt"))
    assert pins and all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+]+", pin) for pin in pins), pins
    dev = set(_requirement_lines(os.path.join(REPO, "tests", "requirements.txt")))
    assert set(pins) <= dev, "tests/requirements.txt must pin the trainer's dependencies as trainer/requirements.txt"
    sys.path.insert(0, os.path.join(REPO, "tests"))
    try:
        from harness import golden
    finally:
        sys.path.pop(0)
    assert golden.HEAVY_REQUIREMENTS == pins, "the harness golden venv must hold the trainer's pins"


def test_the_training_role_expects_the_bundled_trainer_version():
    with open(os.path.join(REPO, "trainer", "pyproject.toml")) as f:
        version = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)
    training = load(REPO, "roles", "training", "defaults", "main.yml")
    spec = load(REPO, "roles", "training", "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert training["training_expect_trainer_version"] == version
    assert spec["training_expect_trainer_version"]["default"] == version
