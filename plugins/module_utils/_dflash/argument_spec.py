# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""An argument spec that modules build from shared parts (community.crypto's pattern).

Each option and each default is declared once: shared options in a function returning an ArgumentSpec
(e.g. transport_argument_spec()), which each module merges with its own and turns into its AnsibleModule.
"""

from __future__ import annotations

import copy


class ArgumentSpec(object):
    KEYS = ("required_if", "required_one_of", "mutually_exclusive", "required_together")

    def __init__(self, argument_spec=None, **constraints):
        unknown = set(constraints) - set(self.KEYS)
        if unknown:
            raise TypeError("unknown constraint keys %s" % sorted(unknown))
        self.argument_spec = dict(argument_spec or {})
        self.constraints = dict((key, list(constraints.get(key) or [])) for key in self.KEYS)

    def merge(self, other):
        """Add other's options and constraints; an option declared twice is a programming error."""
        clash = set(self.argument_spec) & set(other.argument_spec)
        if clash:
            raise TypeError("options declared twice: %s" % sorted(clash))
        self.argument_spec.update(other.argument_spec)
        for key in self.KEYS:
            self.constraints[key].extend(other.constraints[key])
        return self

    def defaults(self):
        """{option: its default (None when it has none)}: the params a module gets when nothing is set."""
        return dict((name, copy.deepcopy(spec.get("default"))) for name, spec in self.argument_spec.items())

    def create_ansible_module(self, **kwargs):
        from ansible.module_utils.basic import AnsibleModule

        kwargs.update((key, value) for key, value in self.constraints.items() if value)
        return AnsibleModule(argument_spec=self.argument_spec, **kwargs)
