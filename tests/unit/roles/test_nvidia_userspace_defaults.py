"""The nvidia_userspace role repeats the nvidia_userspace module's defaults (inventory → module wiring); each must
equal the module's argument spec, the one place a default is declared. Also: defaults/main.yml and argument_specs.yml
name the same variables, all prefixed with the role's name."""
import os

import jinja2
import pytest
import yaml

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.nvidia_userspace_backend import (
    argument_spec)

ROLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "roles", "nvidia_userspace")
# Role variables that differ from the module option of the same name on purpose.
ON_PURPOSE = {}


def load(*parts):
    with open(os.path.join(ROLE, *parts)) as f:
        return yaml.safe_load(f)


DEFAULTS = load("defaults", "main.yml")
SPEC = load("meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
MODULE = argument_spec().argument_spec
COERCE = {"float": float, "int": int, "bool": bool, "str": str, "path": str, "list": list, "dict": dict}


def rendered_default(value):
    """A role default as it resolves when the inventory sets nothing (dflash_* undefined)."""
    if not isinstance(value, str) or "{{" not in value:
        return value
    text = jinja2.Environment().from_string(value).render(omit="__omit__")
    return yaml.safe_load(text) if text else text


def shared_options():
    return [(var, var[len("nvidia_userspace_"):]) for var in sorted(SPEC)
            if var[len("nvidia_userspace_"):] in MODULE and var not in ON_PURPOSE]


def test_defaults_and_argument_specs_name_the_same_prefixed_variables():
    assert set(DEFAULTS) == set(SPEC)
    assert all(name.startswith("nvidia_userspace_") for name in DEFAULTS)


def test_the_comparison_covers_the_options_and_transport():
    names = [opt for _, opt in shared_options()]
    assert {"transport", "pct_path", "host_version_file", "installer_dir", "installer_args", "staging_dir", "marker",
            "expected_gpus", "verify", "timeout"} <= set(names)


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
    role_type = SPEC[var]["type"]
    assert role_type == {"path": "str"}.get(MODULE[option]["type"], MODULE[option]["type"]), var
    assert sorted(SPEC[var].get("choices") or []) == sorted(MODULE[option].get("choices") or []), var
