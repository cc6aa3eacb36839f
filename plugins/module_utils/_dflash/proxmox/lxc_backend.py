# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Backend of the proxmox_lxc module: params → checks that need no API → reads → one create or one config update
(sent with the digest read) → start/stop → result. Every refusal is one line, raised before anything changes.

Uses only module.params, module.check_mode, module._diff and module.warn, so tests can pass a small stand-in.
"""

from __future__ import annotations

import re

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox import gpu, lxc_config, memory
from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox.api import (
    ROOT, Api, ApiError, caller_name, proxmox_api_argument_spec, version_tuple)

STATES = ("present", "started", "stopped", "absent")
DEVN_SINCE = (8, 1)  # pve-container 5.0.7
CLASH = "changed by other user"


def argument_spec():
    """proxmox_lxc's options: the only place their defaults are declared (the docs are checked against it)."""
    own = ArgumentSpec(argument_spec=dict(
        node=dict(type="str", required=True),
        vmid=dict(type="int", required=True),
        state=dict(type="str", default="present", choices=list(STATES)),
        ostemplate=dict(type="str"),
        hostname=dict(type="str"),
        cores=dict(type="int"),
        swap=dict(type="int"),
        rootfs=dict(type="str"),
        mounts=dict(type="list", elements="dict", options=dict(
            source=dict(type="str", required=True),
            target=dict(type="str", required=True),
            read_only=dict(type="bool", default=False),
            options=dict(type="str"),
        )),
        features=dict(type="dict"),
        unprivileged=dict(type="bool"),
        onboot=dict(type="bool"),
        nets=dict(type="list", elements="str"),
        config=dict(type="dict"),
        gpus=dict(type="list", elements="int"),
        host_devices=dict(type="list", elements="str"),
        stop_timeout=dict(type="int", default=120),
        task_timeout=dict(type="int", default=600),
    ))
    return proxmox_api_argument_spec().merge(own).merge(memory.sizing_argument_spec())


def manage_container(module, api_factory=Api):
    p = module.params
    try:
        shm_gib = memory.shm_size_gib(p["weights_gib"], p["shm_margin"])
        if p["gpus"] and p["host_devices"] is None:
            raise ValueError("gpus needs host_devices (the /dev/nvidia* nodes that exist on the Proxmox host; the "
                             "proxmox_lxc role reads them there)")
        gpu_paths = gpu.gpu_device_paths(p["gpus"], p["host_devices"])
        if p["memory"] is not None:
            memory.check_memory(p["memory"], shm_gib, p["trainer_memory_gib"])
        return Container(module, api_factory(p), shm_gib, gpu_paths).converge()
    except (ValueError, ApiError) as exc:
        raise ModuleFailure(str(exc))


class Container(object):
    def __init__(self, module, api, shm_gib, gpu_paths):
        self.module, self.api, self.p = module, api, module.params
        self.node, self.vmid = self.p["node"], self.p["vmid"]
        self.base = "nodes/%s/lxc/%d" % (self.node, self.vmid)
        self.result = dict(changed=False, vmid=self.vmid, node=self.node, created=False, changes={}, deleted=[],
                           tasks=[], shm_size_gib=shm_gib, gpu_devices=gpu_paths,
                           memory_needed_mib=memory.memory_needed_mib(shm_gib, self.p["trainer_memory_gib"]))
        self.before, self.after = {}, {}

    def converge(self):
        version = self.api.get("version", "read the PVE version")["version"]
        self.result["pve_version"] = version
        devn = version_tuple(version) >= DEVN_SINCE
        self.result["gpu_passthrough"] = "none" if not self.result["gpu_devices"] else "devN" if devn else "raw"
        nodes = [n["node"] for n in self.api.get("nodes", "list the nodes")]
        if self.node not in nodes:
            raise ApiError("node '%s' is not in this cluster (nodes: %s): set node to one of them"
                           % (self.node, ", ".join(sorted(nodes))))
        vms = [int(v["vmid"]) for v in self.api.get("nodes/%s/qemu" % self.node, "list the VMs")]
        if self.vmid in vms:
            raise ApiError("vmid %d is a VM on node %s, not a container: choose another vmid for the container"
                           % (self.vmid, self.node))
        cts = dict((int(c["vmid"]), c) for c in self.api.get("nodes/%s/lxc" % self.node, "list the containers"))
        status = cts[self.vmid].get("status") if self.vmid in cts else "absent"
        if self.p["state"] == "absent":
            return self.finish(self.destroy(status) if status != "absent" else "absent")
        devices = lxc_config.dev_entries_for(self.result["gpu_devices"]) if devn else {}
        want = lxc_config.wanted_config(self.p, devices)
        families = lxc_config.managed_families(self.p) - (set() if devn else {"dev"})
        if status == "absent":
            self.create(want)
            status = "stopped"
        else:
            self.update(want, families, status)
        if self.p["state"] == "started" and status != "running":
            status = self.task("post", self.base + "/status/start", "start CT %d" % self.vmid, "running")
        elif self.p["state"] == "stopped" and status == "running":
            status = self.task("post", self.base + "/status/shutdown", "shut CT %d down" % self.vmid, "stopped",
                               timeout=self.p["stop_timeout"], forceStop=1)
        return self.finish(status)

    def task(self, method, path, what, status_after, **data):
        self.result["changed"] = True
        if not self.module.check_mode:
            upid = getattr(self.api, method)(path, what, **data)
            self.result["tasks"].append(self.api.wait_task(self.node, upid, self.p["task_timeout"], what))
        return status_after

    def refuse_root_only(self, keys):
        who = caller_name(self.p)
        if keys and who != ROOT:
            raise ApiError("CT %d: changing %s is allowed only to the user root@pam itself, and this module logs in as %s%s: "
                           "provision as root@pam with a password (api_user=root@pam, api_password), or pre-create "
                           "them as root on the host (pct set %d …) and run again"
                           % (self.vmid, ", ".join(keys), who, " (an API token)" if "!" in who else "", self.vmid))

    def check_memory(self, current_memory):
        mem = self.p["memory"] if self.p["memory"] is not None else int(current_memory or memory.DEFAULT_MEMORY)
        memory.check_memory(mem, self.result["shm_size_gib"], self.p["trainer_memory_gib"])

    def create(self, want):
        if not self.p["ostemplate"]:
            raise ApiError("CT %d does not exist on node %s: set ostemplate (e.g. local:vztmpl/debian-12-standard_"
                           "12.7-1_amd64.tar.zst) to create it" % (self.vmid, self.node))
        self.check_memory(None)
        changes = dict((k, (None, v)) for k, v in want.items())
        self.refuse_root_only(lxc_config.root_only(changes, [], {}, True))
        self.result["created"] = True
        self.result["changes"] = dict((k, dict(before=None, after=v)) for k, v in sorted(want.items()))
        self.after = dict(want)
        try:
            self.task("post", "nodes/%s/lxc" % self.node, "create CT %d" % self.vmid, "stopped", vmid=self.vmid,
                      ostemplate=self.p["ostemplate"], **want)
        except ApiError as exc:
            raise ApiError(create_refusal(str(exc), self.p, self.node))

    def update(self, want, families, status):
        current = self.api.get(self.base + "/config", "read CT %d's config" % self.vmid)
        digest = current.get("digest")
        lxc_config.check_create_only(want, current, self.vmid)
        self.check_memory(current.get("memory"))
        changes, deletes = lxc_config.plan(want, current, families)
        self.refuse_root_only(lxc_config.root_only(changes, deletes, current, False))
        self.result["changes"] = dict((k, dict(before=b, after=a)) for k, (b, a) in sorted(changes.items()))
        self.result["deleted"] = deletes
        self.before = dict((k, b) for k, (b, _a) in changes.items() if b is not None)
        self.before.update((k, str(current[k])) for k in deletes)
        self.after = dict((k, a) for k, (_b, a) in changes.items())
        if not changes and not deletes:
            return
        self.result["changed"] = True
        cold = sorted(k for k in list(changes) + deletes if k not in ("memory", "swap", "cores", "hostname", "onboot"))
        if status == "running" and cold:
            self.module.warn("CT %d is running: %s take effect at its next start" % (self.vmid, ", ".join(cold)))
        if self.module.check_mode:
            return
        data = dict((k, a) for k, (_b, a) in changes.items())
        if deletes:
            data["delete"] = ",".join(deletes)
        try:
            self.api.put(self.base + "/config", "update CT %d's config" % self.vmid, digest=digest, **data)
        except ApiError as exc:
            if CLASH in str(exc):
                raise ApiError("CT %d's config was changed by someone else meanwhile (digest clash); nothing was "
                               "applied: run again" % self.vmid)
            raise

    def destroy(self, status):
        self.before = dict((k, str(v)) for k, v in self.api.get(
            self.base + "/config", "read CT %d's config" % self.vmid).items() if k not in ("digest", "lxc"))
        if status == "running":
            self.task("post", self.base + "/status/stop", "stop CT %d" % self.vmid, "stopped")
        self.task("delete", self.base, "destroy CT %d" % self.vmid, "absent")
        self.result["deleted"] = sorted(self.before)
        return "absent"

    def finish(self, status):
        self.result["status"] = status
        if getattr(self.module, "_diff", False):
            self.result["diff"] = dict(before=as_text(self.before), after=as_text(self.after),
                                       before_header="CT %d" % self.vmid, after_header="CT %d" % self.vmid)
        return self.result


def as_text(config):
    return "".join("%s: %s\n" % (k, config[k]) for k in sorted(config, key=lxc_config.key_order))


def create_refusal(msg, p, node):
    """PVE's create refusals, made into what to do."""
    pve = re.sub(r"^\d{3} ", "", msg.split(": ", 1)[-1])
    if "does not exist" in msg and p["ostemplate"] and ("'%s'" % p["ostemplate"]) in msg:
        return ("template %s does not exist on node %s: download it (pveam download %s %s) or fix ostemplate"
                % (p["ostemplate"], node, p["ostemplate"].split(":", 1)[0], p["ostemplate"].rsplit("/", 1)[-1]))
    if "storage '" in msg and "does not exist" in msg:
        return "%s on node %s: fix rootfs/ostemplate/mounts (pvesm status lists the storages)" % (pve, node)
    if "already exists" in msg:
        return "%s: choose another vmid" % pve
    return msg
