# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Filter `dflash.ops.gpu_list`: a GPU list as an operator writes it (a list, an index, or `0,1,2`) as [int]."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.operator_inputs import (
    InputError, gpu_list)


def _gpu_list(value, name="GPU list"):
    try:
        return gpu_list(value, name)
    except InputError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):
    def filters(self):
        return {"gpu_list": _gpu_list}
