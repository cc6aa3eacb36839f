#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_weights
short_description: Stage a model's weights into /dev/shm inside the training container, atomically and idempotently
description:
  - Copies a Hugging Face model directory (safetensors shards, config, tokenizer files) from O(source) - the model
    store, typically a host path bind-mounted read-only into the container - to O(dest) (for example
    C(/dev/shm/Qwen3.6-27B)) inside a Proxmox LXC container (through C(pct exec)) or on the host itself
    (O(transport=local)). The whole staging runs inside the container in one transport call.
  - O(dest) is a symlink to a complete version directory beside it (C(.<name>.v<stamp>)). A new version is built in
    a temporary sibling - files that did not change are hard-linked from the current version (no copy, no memory),
    the others copied in parallel while being hashed - checked (sizes; the source did not change while copied),
    its manifest written last, then O(dest) is switched in one rename and the old version removed. A failed or
    killed staging leaves the previous version in place and served; the next run removes what it left.
  - An unchanged source (names, sizes and mtimes equal to the manifest, staged files with the manifest's sizes) is a
    no-op that reads no shard. A real directory at O(dest) (a stage made by hand) is adopted - its files are
    checked against the source by content instead of being copied again - and replaced by the symlink.
  - Before copying, refuses with the numbers when the bytes to copy exceed the free space of O(dest)'s file system
    or the room left by the container's memory cgroup (tmpfs pages count against it), and refuses to replace weights
    that a live run under O(runs_root) uses as C(--target-model) unless O(force=true).
  - The manifest C(.dflash-manifest.json) lists every file with its size, source mtime and content hash (xxh3_128
    where the container's python3 has C(xxhash), else blake2b) and C(complete=true); C(dflash-train) refuses a
    C(--target-model) whose manifest is not complete.
version_added: 0.1.0
author: dflash.ops maintainers (!UNKNOWN)
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Plans only - which files would be copied, linked or removed, and whether the room and live-run checks
      pass; writes nothing (O(verify=full) still reads the staged files to find mismatches).
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: Shows the staged files (names and sizes) before and after.
extends_documentation_fragment:
  - dflash.ops.transport
options:
  source:
    description: The model directory to stage (it must hold C(config.json)); names starting with C(.) are skipped.
    type: path
    required: true
  dest:
    description: Where readers find the weights, for example C(/dev/shm/Qwen3.6-27B); its parent must exist.
    type: path
    required: true
  verify:
    description:
      - V(size) trusts staged files whose source name, size and mtime are unchanged (no shard is read).
      - V(full) also re-hashes every staged file against the manifest and copies again any that differ.
    type: str
    choices: [size, full]
    default: size
  force:
    description: Replace the weights even when a live run uses O(dest) as its C(--target-model) (it keeps the files
      it has open).
    type: bool
    default: false
  runs_root:
    description: Directory of the run directories, searched for live runs that use O(dest).
    type: path
    default: /workspace/runs
  threads:
    description: Files copied or hashed at the same time (1 to 64).
    type: int
    default: 4
  python:
    description:
      - Python interpreter at the target that runs the staging code (stdlib only; uses C(xxhash) when installed).
      - Defaults to C(python3) inside a container, and to the module's own interpreter with O(transport=local).
    type: str
  lock_timeout:
    description: Seconds to wait for another staging of the same O(dest).
    type: float
    default: 600
  timeout:
    description: Seconds the whole transport call may take.
    type: float
    default: 7200
  progress_file:
    description:
      - A file in the container where the copy's progress is kept while it runs (JSON - C(phase), C(copied_bytes),
        C(total_bytes), C(mb_per_s), C(updated_at)), rewritten about once a second; the role runs this module with
        C(async) and reads it to print progress. None is kept when not given.
    type: path
seealso:
  - module: dflash.ops.training_run
notes:
  - The file system of O(dest) is emptied when the container restarts (C(/dev/shm)); run the staging again then.
  - Between the two versions' lifetimes both exist; only the changed files take extra room.
"""

EXAMPLES = r"""
- name: Stage Qwen3.6-27B from the model store into CT 200's /dev/shm
  dflash.ops.model_weights:
    vmid: 200
    source: /mnt/models/Qwen3.6-27B
    dest: /dev/shm/Qwen3.6-27B

- name: Re-hash the staged copy and repair any damaged file
  dflash.ops.model_weights:
    vmid: 200
    source: /mnt/models/Qwen3.6-27B
    dest: /dev/shm/Qwen3.6-27B
    verify: full

- name: Stage on this host (no container)
  dflash.ops.model_weights:
    transport: local
    source: /srv/models/tiny
    dest: /dev/shm/tiny
  register: staged
"""

RETURN = r"""
staged:
  description: O(dest), the path readers open (a symlink to RV(version)); named so that Ansible does not add file
    attributes to the result.
  returned: always
  type: str
  sample: /dev/shm/Qwen3.6-27B
source:
  description: The model directory staged from.
  returned: success
  type: str
  sample: /mnt/models/Qwen3.6-27B
version:
  description: The version directory O(dest) points to after the task (null when nothing is staged yet in check
    mode, or the current directory is a hand-made one).
  returned: success
  type: str
  sample: /dev/shm/.Qwen3.6-27B.v20261130T101500-4242
manifest:
  description: Path of the manifest.
  returned: success
  type: str
  sample: /dev/shm/Qwen3.6-27B/.dflash-manifest.json
hash_algorithm:
  description: Content hash of the manifest, V(xxh3_128) or V(blake2b-128).
  returned: success
  type: str
  sample: xxh3_128
copied:
  description: Files copied from the source (in check mode, that would be).
  returned: success
  type: list
  elements: str
  sample: [model-00003-of-00011.safetensors]
linked:
  description: Files hard-linked from the current version into the new one (empty for a no-op).
  returned: success
  type: list
  elements: str
  sample: [config.json, model-00001-of-00011.safetensors]
removed:
  description: Files of the current version that the source no longer has.
  returned: success
  type: list
  elements: str
  sample: []
mismatched:
  description: Staged files whose content differed from the manifest or the source, copied again.
  returned: success
  type: list
  elements: str
  sample: []
verified:
  description: Files re-hashed in place by O(verify=full).
  returned: success
  type: list
  elements: str
  sample: [config.json, model-00001-of-00011.safetensors]
cleaned:
  description: Leftovers of earlier stagings removed (temporary or replaced versions).
  returned: success
  type: list
  elements: str
  sample: [/dev/shm/.Qwen3.6-27B.tmp-4100-20261130T101000-4100]
bytes_copied:
  description: Bytes copied (in check mode, that would be).
  returned: success
  type: int
  sample: 4900000000
bytes_total:
  description: Bytes of the whole model.
  returned: success
  type: int
  sample: 54000000000
files_total:
  description: Files of the whole model.
  returned: success
  type: int
  sample: 18
seconds:
  description: Wall time of the staging inside the container.
  returned: success
  type: float
  sample: 21.4
mb_per_s:
  description: Copy throughput in MB/s (10^6 bytes per second) while copying.
  returned: when a new version was staged
  type: float
  sample: 2310.5
room:
  description: The room check - bytes needed, free on O(dest)'s file system, the memory cgroup's limit and what it
    leaves (null without a limit).
  returned: when something would change
  type: dict
  sample: {needed_bytes: 4900000000, free_bytes: 60000000000, memory_limit_bytes: 137438953472,
           memory_available_bytes: 70000000000}
live_runs:
  description: Live runs using O(dest) (replaced under them with O(force=true)).
  returned: when something would change
  type: list
  elements: str
  sample: []
needed_bytes:
  description: On a refusal for room, the bytes to copy (with C(free_bytes), C(memory_limit_bytes),
    C(memory_available_bytes)).
  returned: when refused for room
  type: int
  sample: 54000000000
"""

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.weights_backend import (
    argument_spec, stage_weights)


def main():
    module = argument_spec().create_ansible_module(supports_check_mode=True)
    try:
        result = stage_weights(module)
    except ModuleFailure as exc:
        module.fail_json(msg=str(exc), **exc.facts)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
