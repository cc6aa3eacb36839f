# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""A container's wanted PVE config, and its difference from the config the API reports. Pure functions.

PVE rewrites some values it is given (`rootfs: local-lvm:8` becomes `local-lvm:vm-200-disk-0,size=8G`; a netN gains
`hwaddr=` and `type=veth`), so values are compared by meaning: scalars as strings, features as flag sets, devN and
bind mounts by every property, netN by the properties asked for, storage volumes by storage, mount point and
read-only flag (their size is create-only, as rootfs's).
"""

from __future__ import annotations

import re

FAMILY = re.compile(r"^(mp|net|dev)(\d+)$")
VOLUME = re.compile(r"^([A-Za-z][\w.-]*):(\d+(?:\.\d+)?)$")
SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)$")
CREATE_ONLY = ("rootfs", "unprivileged")


def dev_entries_for(paths):
    """{"dev0": "/dev/nvidia0", …}: PVE's devN keys for host device nodes (PVE adds the cgroup allow itself)."""
    return dict(("dev%d" % i, path) for i, path in enumerate(paths))


def parse_props(value, default_key):
    """PVE property string → dict ("local:8,mp=/x" → {volume: "local:8", mp: "/x"}); the first bare item is the
    default key's value."""
    out = {}
    for item in str(value).split(","):
        if not item:
            continue
        if "=" in item:
            key, val = item.split("=", 1)
            out[key] = val
        else:
            out[default_key] = item
    return out


def format_props(props, default_key):
    first = [props[default_key]] if default_key in props else []
    return ",".join(first + ["%s=%s" % (k, v) for k, v in props.items() if k != default_key])


def bool01(value):
    return "1" if value in (True, 1, "1", "true", "yes", "on") else "0"


def mount_value(mount):
    """One `mounts` item → an mpN value: `source,mp=target[,ro=1][,options]`."""
    source, target = mount.get("source"), mount.get("target")
    if not source or not target or not str(target).startswith("/"):
        raise ValueError("each mount needs source (a host path or STORAGE:GiB) and an absolute target, got %r"
                         % (mount,))
    value = "%s,mp=%s" % (source, target)
    if mount.get("read_only"):
        value += ",ro=1"
    if mount.get("options"):
        value += "," + mount["options"]
    return value


def is_bind(value):
    return str(parse_props(value, "volume").get("volume", "")).startswith("/")


def features_value(features):
    flags = sorted((k, bool01(v) if isinstance(v, bool) or str(v) in ("0", "1") else str(v))
                   for k, v in (features or {}).items())
    return ",".join("%s=%s" % kv for kv in flags if kv[1] != "0")


def wanted_config(p, devices):
    """{key: value} of the options set in p (unset ones are not managed), with devices = {devN: path}."""
    want = {}
    for key in ("hostname", "cores", "memory", "swap", "rootfs"):
        if p.get(key) is not None:
            want[key] = str(p[key])
    for key in ("unprivileged", "onboot"):
        if p.get(key) is not None:
            want[key] = bool01(p[key])
    if p.get("features") is not None:
        want["features"] = features_value(p["features"])
    for i, mount in enumerate(p.get("mounts") or []):
        want["mp%d" % i] = mount_value(mount)
    for i, net in enumerate(p.get("nets") or []):
        want["net%d" % i] = net
    want.update(devices or {})
    for key, value in (p.get("config") or {}).items():
        if key in want or FAMILY.match(key) or key in ("digest", "delete", "lxc"):
            raise ValueError("config may not set %s: use the module's own option for it" % key)
        want[key] = bool01(value) if isinstance(value, bool) else str(value)
    return want


def managed_families(p):
    """Indexed key families whose extra entries are deleted: those whose option was given (even empty)."""
    out = set()
    if p.get("mounts") is not None:
        out.add("mp")
    if p.get("nets") is not None:
        out.add("net")
    if p.get("gpus") is not None:
        out.add("dev")
    return out


def same(key, want, have):
    """Whether the current value `have` already means `want`."""
    if have is None:
        return want in ("", "0") and key in ("features", "unprivileged", "onboot")
    fam = FAMILY.match(key)
    if key == "features":
        return parse_props(want, "_") == dict((k, v) for k, v in parse_props(have, "_").items() if v != "0")
    if key == "unprivileged" or key == "onboot":
        return bool01(str(have)) == want
    if fam and fam.group(1) == "net":
        w, h = parse_props(want, "_"), parse_props(have, "_")
        return all(h.get(k) == v for k, v in w.items())
    if fam and fam.group(1) == "dev":
        return parse_props(want, "path") == parse_props(have, "path")
    if fam and fam.group(1) == "mp":
        w, h = parse_props(want, "volume"), parse_props(have, "volume")
        w.setdefault("ro", "0")
        h.setdefault("ro", "0")
        vol = VOLUME.match(w["volume"])
        if vol:  # a new volume STORAGE:GiB: the same storage, mount point and flags; size is create-only
            h_storage = h.get("volume", "").split(":", 1)[0]
            w_rest = dict((k, v) for k, v in w.items() if k not in ("volume", "size"))
            return h_storage == vol.group(1) and all(h.get(k) == v for k, v in w_rest.items())
        return all(h.get(k) == v for k, v in w.items())
    return str(want) == str(have)


def update_value(key, want, have):
    """The value to send for a changed key (a netN keeps its MAC address when none is asked for)."""
    fam = FAMILY.match(key)
    if fam and fam.group(1) == "net" and have:
        w, h = parse_props(want, "_"), parse_props(have, "_")
        if "hwaddr" not in w and "hwaddr" in h:
            w["hwaddr"] = h["hwaddr"]
            return format_props(w, "_")
    return want


def plan(want, current, families):
    """(changes {key: (before, after)}, deletes [key]) that turn current into want. Create-only keys excluded."""
    changes = {}
    for key, value in want.items():
        if key in CREATE_ONLY:
            continue
        have = current.get(key)
        if not same(key, value, None if have is None else str(have)):
            changes[key] = (None if have is None else str(have), update_value(key, value, have))
    deletes = sorted((k for k in current if k not in want and FAMILY.match(k)
                      and FAMILY.match(k).group(1) in families), key=key_order)
    if "features" in want and want["features"] == "" and current.get("features"):
        changes.pop("features", None)
        deletes.append("features")
    return changes, deletes


def key_order(key):
    m = FAMILY.match(key)
    return (m.group(1), int(m.group(2))) if m else ("", 0, key)


def _gib(size_text):
    m = SIZE.match(size_text or "")
    if not m:
        return None
    return float(m.group(1)) * {"K": 1.0 / 1024 ** 2, "M": 1.0 / 1024, "G": 1.0, "T": 1024.0, "": 1.0}[m.group(2)]


def check_create_only(want, current, vmid):
    """Refuse what PUT …/config cannot change on an existing container, naming the way out."""
    if "unprivileged" in want and bool01(str(current.get("unprivileged", 0))) != want["unprivileged"]:
        raise ValueError("CT %d is %s, wanted %s: that is fixed at creation; recreate the container (state=absent, "
                         "then present) or set unprivileged=%s"
                         % (vmid, "unprivileged" if want["unprivileged"] == "0" else "privileged",
                            "privileged" if want["unprivileged"] == "0" else "unprivileged",
                            "true" if want["unprivileged"] == "0" else "false"))
    if "rootfs" in want and current.get("rootfs"):
        w, h = parse_props(want["rootfs"], "volume"), parse_props(current["rootfs"], "volume")
        vol = VOLUME.match(w["volume"])
        if vol:
            storage, size = vol.group(1), float(vol.group(2))
            h_storage, h_size = h["volume"].split(":", 1)[0], _gib(h.get("size"))
            if h_storage != storage:
                raise ValueError("CT %d's rootfs is on storage %s, wanted %s: move it with pct move-volume %d rootfs "
                                 "%s, or set rootfs to %s:<GiB>" % (vmid, h_storage, storage, vmid, storage, h_storage))
            if h_size is not None and h_size + 1e-9 < size:
                raise ValueError("CT %d's rootfs is %gG, wanted %gG: grow it with pct resize %d rootfs %gG (a config "
                                 "update cannot), or set rootfs to %s:%g" % (vmid, h_size, size, vmid, size, storage,
                                                                             h_size))


def root_only(changes, deletes, current, create):
    """The keys of a request that PVE allows only to the exact user root@pam (docs/proxmox.md): devN, bind mounts, and
    feature flags other than nesting (any flag of a privileged container)."""
    keys = []
    for key, (_before, after) in sorted(changes.items()):
        fam = FAMILY.match(key)
        if fam and fam.group(1) == "dev":
            keys.append(key)
        elif fam and fam.group(1) == "mp" and (is_bind(after) or (current.get(key) and is_bind(current[key]))):
            keys.append(key + " (bind mount)")
        elif key == "features" and set(parse_props(after, "_")) - {"nesting"}:
            keys.append("features (%s)" % after)
    for key in deletes:
        fam = FAMILY.match(key)
        if fam and (fam.group(1) == "dev" or (fam.group(1) == "mp" and is_bind(current.get(key, "")))):
            keys.append(key + " (delete)")
    return keys
