# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The inputs an operator types for a training run, checked where they enter (action dflash.ops.training_inputs).

Each refusal is one line that names the variable as the operator wrote it (``dflash_target_gpus``, ``force``,
``dflash_runs.slammed5.trainer_args.lr``), says what is wrong and gives a valid example. The role's own
variables (training_*) are derived from these; their argument spec stays the contract for direct users of the role.
Also the one place that reads a GPU list the way an operator writes it (a list, an index, or ``0,1,2``).
"""

from __future__ import annotations

import json
import math
import re

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.run_name import validate_run_name

FLAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
SECONDS = ("dflash_stop_timeout", "dflash_gpu_release_timeout", "dflash_heartbeat_timeout", "dflash_phase_timeout")
TRUE = ("true", "yes", "on", "1")
FALSE = ("false", "no", "off", "0", "")


class InputError(ValueError):
    """One operator input is wrong: the message names it, says why and shows a valid value."""


def _shown(value):
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def gpu_list(value, name="dflash_target_gpus"):
    """[int, ...] from a list, an index or a comma string ('' and None: none); InputError otherwise."""
    example = "give GPU indexes as a list or a comma string, e.g. %s=0,1,2 or %s: [0, 1, 2]" % (name, name)
    if value is None:
        return []
    if isinstance(value, bool):
        raise InputError("%s is %s, not a GPU list; %s" % (name, _shown(value), example))
    if isinstance(value, int):
        items = [value]
    elif isinstance(value, str):
        items = [part.strip() for part in value.split(",")] if value.strip() else []
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise InputError("%s is %s, not a GPU list; %s" % (name, _shown(value), example))
    gpus = []
    for item in items:
        if isinstance(item, bool) or not (isinstance(item, int) or (isinstance(item, str) and item.isdigit())):
            raise InputError("%s is %s: %s is not a GPU index (a whole number from 0); %s"
                             % (name, _shown(value), _shown(item), example))
        gpus.append(int(item))
    if any(g < 0 for g in gpus):
        raise InputError("%s is %s: GPU indexes start at 0; %s" % (name, _shown(value), example))
    if len(set(gpus)) != len(gpus):
        raise InputError("%s is %s: a GPU is listed twice; list each GPU once, e.g. %s=0,1"
                         % (name, _shown(value), name))
    return gpus


def boolean(value, name):
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, int)) and str(value).strip().lower() in TRUE + FALSE:
        return str(value).strip().lower() in TRUE
    raise InputError("%s is %s; give true or false, e.g. -e %s=true" % (name, _shown(value), name))


def seconds(value, name):
    example = "give seconds, e.g. -e %s=600" % name
    if isinstance(value, bool):
        raise InputError("%s is %s, not a number of seconds; %s" % (name, _shown(value), example))
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError("%s is %s, not a number of seconds; %s" % (name, _shown(value), example))
    if math.isnan(number) or number < 0 or math.isinf(number):
        raise InputError("%s is %s; it must be 0 or more seconds; %s" % (name, _shown(value), example))
    return number


def whole(value, name, low, example):
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise InputError("%s is %s, not a whole number; give e.g. -e %s=%s" % (name, _shown(value), name, example))
    try:
        number = int(str(value).strip())
    except ValueError:
        raise InputError("%s is %s, not a whole number; give e.g. -e %s=%s" % (name, _shown(value), name, example))
    if number < low:
        raise InputError("%s is %s; it must be %d or more, e.g. -e %s=%s" % (name, _shown(value), low, name,
                                                                             example))
    return number


def _scalar(value):
    return value is None or isinstance(value, (str, int, float, bool))


def run_config(config, name):
    """A run's configuration (dflash_run_defaults, or dflash_runs.<run>): trainer_args, env, gpus, nproc_per_node."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise InputError("%s is %s; give a mapping, e.g. %s: {trainer_args: {lr: 3.0e-4}}"
                         % (name, _shown(config), name))
    args = config.get("trainer_args")
    if args is not None:
        if not isinstance(args, dict):
            raise InputError("%s.trainer_args is %s; give a mapping of trainer flags, e.g. {lr: 3.0e-4, "
                             "block_size: 16}" % (name, _shown(args)))
        for key, value in sorted(args.items(), key=lambda kv: str(kv[0])):
            where = "%s.trainer_args.%s" % (name, key)
            if not isinstance(key, str) or not FLAG_RE.fullmatch(key):
                raise InputError("%s.trainer_args has the key %s, not a flag name; use letters, digits, - and _ "
                                 "(e.g. block_size)" % (name, _shown(key)))
            if isinstance(value, dict) or (isinstance(value, (list, tuple)) and not all(_scalar(v) for v in value)):
                raise InputError("%s is %s; a trainer flag takes a string, number, true/false or a list of those, "
                                 "e.g. %s: 16" % (where, _shown(value), key))
    env = config.get("env")
    if env is not None:
        if not isinstance(env, dict):
            raise InputError("%s.env is %s; give a mapping of variables, e.g. {DFLASH_PROFILE_INTERVAL: \"60\"}"
                             % (name, _shown(env)))
        for key, value in env.items():
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise InputError("%s.env.%s is %s; give the variable's text, e.g. %s: \"1\""
                                 % (name, key, _shown(value), key))
    if "gpus" in config:
        gpu_list(config["gpus"], "%s.gpus" % name)
    if "nproc_per_node" in config:
        whole(config["nproc_per_node"], "%s.nproc_per_node" % name, 1, "8")


# What check() reads, by the name the operator writes (a run's own name first, then the role's for direct users).
NAMES = ("run", "training_run_name", "dflash_runs", "training_runs", "dflash_run_defaults", "training_run_defaults",
         "force", "report", "dflash_target_gpus", "dflash_drafter_gpus", "dflash_keep_records", "dflash_nproc_per_node",
         "dflash_vmid") + SECONDS


TEMPLATE_MARKS = ("{{", "{%", "{#")  # Jinja's: Ansible templates a value holding one (-e values included)


def refuse_templated_run(raw):
    """Refuse (InputError) `raw`, the run name as typed (-e run=..., before anything templated it), when it is a
    template: Ansible templates -e values, so it would arrive changed (a lookup's output) or empty, and "no run
    given" would be the wrong line; the launcher never templates. (training_run_name, the role's variable, is
    templated on purpose: the role's default is "{{ run }}".)"""
    if isinstance(raw, str) and any(mark in raw for mark in TEMPLATE_MARKS):
        raise InputError("run %s is a template: Ansible templates -e values (a lookup in one runs on this "
                         "controller) and would pass its output as the run name; give the name itself (e.g. -e "
                         "run=slammed5), or start the run with the launcher, which never templates: python -m "
                         "dflash_ops restart NAME (launcher/README.md)" % _shown(raw))


def check(variables):
    """Refuse (InputError) the first wrong operator input of `variables` (what the play sees, by name).

    `run` is the run named on the command line (or training_run_name for direct users of the role); the declared
    runs are dflash_runs (or training_runs).
    """
    runs_name = "dflash_runs" if "dflash_runs" in variables else "training_runs"
    runs = variables.get(runs_name, {})
    if runs is None:
        runs = {}
    if not isinstance(runs, dict):
        raise InputError("%s is %s; give a mapping of run names to their configuration, e.g. %s: {slammed5: {}}"
                         % (runs_name, _shown(runs), runs_name))
    run_var = "run" if "run" in variables else "training_run_name"
    run = variables.get(run_var)
    if run in (None, ""):
        raise InputError("no run given: add -e run=NAME (declared runs: %s)" % (", ".join(sorted(runs)) or "none"))
    try:
        validate_run_name(run)
    except ValueError:
        raise InputError("invalid run name %s (%s): use 1-64 letters, digits, . _ or -, e.g. -e run=slammed5"
                         % (_shown(run), run_var))
    if run not in runs:
        raise InputError("undeclared run %s: declared runs are %s (%s); fix the name, or add the run to %s in the "
                         "inventory" % (run, ", ".join(sorted(runs)) or "none", runs_name, runs_name))
    for name in ("force", "report"):
        if name in variables:
            boolean(variables[name], name)
    for name in ("dflash_target_gpus", "dflash_drafter_gpus"):
        if name in variables:
            gpu_list(variables[name], name)
    for name in SECONDS:
        if name in variables:
            seconds(variables[name], name)
    if "dflash_keep_records" in variables:
        whole(variables["dflash_keep_records"], "dflash_keep_records", 0, "20")
    if "dflash_nproc_per_node" in variables:
        whole(variables["dflash_nproc_per_node"], "dflash_nproc_per_node", 1, "8")
    if "dflash_vmid" in variables:
        whole(variables["dflash_vmid"], "dflash_vmid", 100, "200")
    defaults_name = "dflash_run_defaults" if "dflash_run_defaults" in variables else "training_run_defaults"
    run_config(variables.get(defaults_name), defaults_name)
    run_config(runs[run], "%s.%s" % (runs_name, run))
    return run
