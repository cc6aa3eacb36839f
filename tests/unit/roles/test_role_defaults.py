"""Every role that wires inventory variables to one of our modules: defaults/main.yml and argument_specs.yml name
the same variables, all prefixed with the role's name; each role default that mirrors a module option equals the
module's argument spec (the one place a default is declared), with its type and choices. Differences on purpose
are listed below with their reason."""
import os

import jinja2
import pytest
import yaml

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import (
    nvidia_userspace_backend, trainer_install_backend, training_backend, weights_backend)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox import lxc_backend

ROLES_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "roles")
COERCE = {"float": float, "int": int, "bool": bool, "str": str, "path": str, "list": list, "dict": dict}

# role → (the module's argument spec, options the comparison must cover, {role variable: why it differs}).
ROLES = {
    "training": (training_backend.argument_spec, {
        "stop_timeout", "gpu_release_timeout", "heartbeat_timeout", "phase_timeout", "transport", "pct_path",
        "runs_root", "state", "force", "gpu_device_pattern", "keep_records"}, {
        "training_status_log_lines": "the role's status report shows the log's last lines; the module returns "
                                     "none unless asked, to keep results small",
        "training_gpus": "the role derives it from dflash_target_gpus + dflash_drafter_gpus",
        "training_command": "the module has none (it is required to launch); the role's is where the trainer "
                            "is installed in the container",
        "training_expect_trainer_version": "the module checks no version unless asked; the role asks for the "
                                           "bundled trainer's (tests/unit/roles/test_trainer_role.py)",
    }),
    "model_weights": (weights_backend.argument_spec, {
        "verify", "force", "transport", "pct_path", "runs_root", "threads", "timeout"}, {
        "model_weights_source": "required by the module; the role reads it from dflash_model_source",
        "model_weights_dest": "required by the module; the role reads it from dflash_model_dest",
    }),
    "trainer": (trainer_install_backend.argument_spec, {
        "venvs_root", "link", "keep", "pip_timeout", "compile_bytecode", "transport", "pct_path", "container_wheelhouse",
        "index_url"}, {
        "trainer_wheelhouse": "the role also accepts a controller wheelhouse, staged on the host and passed here",
    }),
    "nvidia_userspace": (nvidia_userspace_backend.argument_spec, {
        "transport", "pct_path", "host_version_file", "installer_dir", "installer_args", "staging_dir", "marker",
        "expected_gpus", "verify", "timeout"}, {}),
    "proxmox_lxc": (lxc_backend.argument_spec, {
        "api_port", "validate_certs", "api_timeout", "shm_margin", "trainer_memory_gib", "stop_timeout",
        "task_timeout", "memory", "mounts", "weights_gib", "api_password", "node", "vmid"}, {
        "proxmox_lxc_api_host": "required by the module; the role reads it from the host's ansible_host",
        "proxmox_lxc_state": "the role starts the container; the module's default only makes it present",
        "proxmox_lxc_api_user": "the role names root@pam; the module falls back to it (or PROXMOX_USER) when unset",
        "proxmox_lxc_gpus": "the role always manages the GPU set (from dflash_*_gpus); the module only when given",
    }),
}


def load(role, *parts):
    with open(os.path.join(ROLES_DIR, role, *parts)) as f:
        return yaml.safe_load(f)


def role_facts(role):
    spec_fn, _, on_purpose = ROLES[role]
    defaults = load(role, "defaults", "main.yml")
    spec = load(role, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    return defaults, spec, spec_fn().argument_spec, on_purpose


def shared_options(role):
    _, spec, module, on_purpose = role_facts(role)
    prefix = role + "_"
    return [(var, var[len(prefix):]) for var in sorted(spec)
            if var[len(prefix):] in module and var not in on_purpose]


def rendered_default(value):
    """A role default as it resolves when the inventory sets nothing (dflash_* undefined)."""
    if not isinstance(value, str) or "{{" not in value:
        return value
    text = jinja2.Environment().from_string(value).render(omit="__omit__")
    return yaml.safe_load(text) if text else text


CASES = [(role, var, option) for role in sorted(ROLES) for var, option in shared_options(role)]


@pytest.mark.parametrize("role", sorted(ROLES))
def test_defaults_and_argument_specs_name_the_same_prefixed_variables(role):
    defaults, spec, _, on_purpose = role_facts(role)
    assert set(defaults) == set(spec)
    assert all(name.startswith(role + "_") for name in defaults)
    assert set(on_purpose) <= set(spec), "a listed exception names no variable of the role"


@pytest.mark.parametrize("role", sorted(ROLES))
def test_the_comparison_covers_the_options_that_matter(role):
    assert ROLES[role][1] <= set(option for _, option in shared_options(role))


@pytest.mark.parametrize("role,var,option", CASES)
def test_role_default_equals_the_module_default(role, var, option):
    defaults, spec, module, _ = role_facts(role)
    module_default = module[option].get("default")
    kind = COERCE[module[option]["type"]]
    if "default" in spec[var]:
        assert kind(spec[var]["default"]) == module_default, "%s in argument_specs.yml" % var
    resolved = rendered_default(defaults[var])
    if resolved == "__omit__":
        return  # the module's own default applies
    assert kind(resolved) == module_default, "%s in defaults/main.yml resolves to %r" % (var, resolved)


@pytest.mark.parametrize("role,var,option", CASES)
def test_role_types_and_choices_follow_the_module(role, var, option):
    _, spec, module, _ = role_facts(role)
    assert spec[var]["type"] == {"path": "str"}.get(module[option]["type"], module[option]["type"]), var
    assert sorted(spec[var].get("choices") or []) == sorted(module[option].get("choices") or []), var
