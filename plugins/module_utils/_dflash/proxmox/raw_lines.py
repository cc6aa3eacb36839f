# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Raw `lxc.*` lines of a PVE container config file (/etc/pve/lxc/<vmid>.conf), as pure functions.

The file holds `key: value` lines, then raw `lxc.*` lines, then optional `[snapshot]` / `[pve:pending]` sections;
only the main section (before the first `[…]`) is touched. A wanted line replaces the lines it *owns*: the same mount
target (lxc.mount.entry), the same device (cgroup devices.allow/deny, access letters aside), the same key for
single-valued keys; any other line is only made present. Everything else in the file is kept byte for byte.
"""

from __future__ import annotations

import re

RAW = re.compile(r"^(lxc\.[a-z0-9_.\-]+)(?::|\s*=)\s*(.*?)\s*$")
DEVICE_RULE = re.compile(r"^lxc\.cgroup2?\.devices\.(allow|deny)$")
SINGLE_VALUED = re.compile(r"^lxc\.(apparmor\.[a-z_]+|seccomp\.profile|cgroup2?\.(?!devices\.)[a-z_]+\.[a-z_.]+|"
                           r"init\.cmd|init\.cwd|rootfs\.path|signal\.[a-z]+)$")
WHOLE_MAJOR = re.compile(r"^c (\d+):\* rwm$")


def parse_line(line):
    """"lxc.key: value" (or PVE's also accepted "lxc.key = value") → (key, value); None for any other line."""
    m = RAW.match(line)
    return (m.group(1), m.group(2)) if m else None


def identity(key, value):
    """What a raw line owns: two lines with the same identity cannot both stay."""
    if key == "lxc.mount.entry":
        fields = value.split()
        return (key, fields[1].strip("/")) if len(fields) > 1 else (key, value)
    if DEVICE_RULE.match(key):
        fields = value.split()
        return (key, " ".join(fields[:2]))
    if SINGLE_VALUED.match(key):
        return (key,)
    return (key, value)


def normalize(line):
    parsed = parse_line(line.strip())
    if parsed is None:
        raise ValueError("not a raw lxc line: %r: write it as 'lxc.<key>: <value>'" % line)
    return "%s: %s" % parsed


def split_main(text):
    """(main section lines, the rest from the first '[section]' line on, verbatim)."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("["):
            return lines[:i], "\n".join(lines[i:])
    return lines, None


def raw_lines(text):
    """The main section's raw lxc lines, normalized to "key: value"."""
    main, _rest = split_main(text)
    return ["%s: %s" % p for p in (parse_line(line) for line in main) if p]


def ensure(text, wanted, stale=None):
    """text with every `wanted` raw line present, the lines they own removed, and raw lines for which
    stale(key, value) is true removed. Returns (new text, added lines, removed lines)."""
    wanted = [normalize(line) for line in wanted]
    owners = {}
    for line in wanted:
        owners.setdefault(identity(*parse_line(line)), line)
    if len(owners) != len(wanted):
        raise ValueError("two wanted raw lines own the same target: %s" % wanted)
    main, rest = split_main(text)
    tail = []
    while main and main[-1].strip() == "":
        tail.insert(0, main.pop())
    kept, removed, placed = [], [], set()
    for line in main:
        parsed = parse_line(line)
        if parsed is None:
            kept.append(line)
            continue
        norm = "%s: %s" % parsed
        ident = identity(*parsed)
        if ident in owners:
            if ident not in placed and norm == owners[ident]:
                kept.append(line)
                placed.add(ident)
            else:
                removed.append(norm)
        elif stale is not None and stale(*parsed):
            removed.append(norm)
        else:
            kept.append(line)
    added = [line for line in wanted if identity(*parse_line(line)) not in placed]
    kept += added
    new = "\n".join(kept + tail)
    if rest is not None:
        new += "\n" + rest
    if text.endswith("\n") and not new.endswith("\n"):
        new += "\n"
    if not text and new and not new.endswith("\n"):
        new += "\n"
    return new, added, removed


def stale_whole_major(majors_in_use):
    """A stale(key, value) for ensure(): a whole-major cgroup allow (`c M:* rwm`) of a major no character device has
    now - what a dynamic major (nvidia-uvm's) leaves behind after a reboot gave the driver another one."""
    in_use = set(majors_in_use)

    def stale(key, value):
        m = WHOLE_MAJOR.match(value)
        return bool(DEVICE_RULE.match(key) and key.endswith("allow") and m and int(m.group(1)) not in in_use)
    return stale
