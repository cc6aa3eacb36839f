"""PVE container config files (`<pve_dir>/nodes/<node>/lxc/<vmid>.conf`) and their LXC rendering.

Stdlib only: the `pct` stand-in runs this file with the host's python3 (`python3 pveconf.py render <vmid>`) before
`lxc-start`, so that `pct set` and raw `lxc.*` lines edited on the "host" take effect at the next start, as on PVE.

A PVE file is `key: value` lines sorted by key, then the raw `lxc.*` lines in the order they were written (PVE's
write_pct_config); the API's `digest` is the SHA-1 of the file's bytes. The LXC container the stand-in runs is
`/var/lib/lxc/<vmid>/config` = `config.base` (what lxc-copy made from the golden) + the lines rendered here.
`/var/lib/lxc/<vmid>/pve_api.json` = {"conf": <PVE file>, "dev_root": <stand-in /dev>} marks a container made
through the API stand-in (pct then reads and writes the PVE file instead of its side file).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

LXC_PATH = Path("/var/lib/lxc")
MIB = 1024 * 1024
MARKER = "pve_api.json"
CGROUP_V1 = not Path("/sys/fs/cgroup/cgroup.controllers").exists()


def digest(raw: bytes | str) -> str:
    return hashlib.sha1(raw.encode() if isinstance(raw, str) else raw).hexdigest()


def parse(text: str) -> tuple[dict, list]:
    """(keys, raw) from a PVE file; raw = [[lxc.key, value], …] in file order. Snapshot sections are ignored."""
    keys: dict[str, str] = {}
    raw: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("["):
            break  # [snapshot] / [pending] sections: not used by the stand-in
        if not line.strip() or line.startswith("#"):
            continue
        k, sep, v = line.partition(":")
        if not sep:
            continue
        k, v = k.strip(), v.strip()
        if k.startswith("lxc."):
            raw.append([k, v])
        else:
            keys[k] = v
    return keys, raw


def format_conf(keys: dict, raw: list) -> str:
    out = [f"{k}: {keys[k]}" for k in sorted(keys)]
    out += [f"{k}: {v}" for k, v in raw]
    return "\n".join(out) + "\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def property_string(value: str, default_key: str) -> dict:
    """`a=1,b=2` with an optional leading bare value for `default_key` (PVE property strings)."""
    out: dict[str, str] = {}
    for i, part in enumerate(value.split(",")):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
        elif i == 0:
            out[default_key] = part.strip()
        else:
            raise ValueError(f"invalid format - format error: '{part}'")
    return out


def device_path(dev_root: str, path: str) -> Path:
    """The host file behind a devN path: `/dev/nvidia0` → `<dev_root>/nvidia0` (never the host's real /dev)."""
    return Path(dev_root) / path[len("/dev/"):]


def _cg(v2_key: str, value: str) -> list[str]:
    """One cgroup setting in the form this host's LXC applies (the test machine may run cgroup v1)."""
    if not CGROUP_V1:
        return [f"lxc.cgroup2.{v2_key} = {value}"]
    mapping = {"memory.max": "memory.limit_in_bytes", "cpuset.cpus": "cpuset.cpus",
               "devices.allow": "devices.allow", "devices.deny": "devices.deny"}
    if v2_key == "memory.swap.max":
        return []  # v1 has no swap-only limit; handled as memsw below
    if v2_key in mapping:
        return [f"lxc.cgroup.{mapping[v2_key]} = {value}"]
    return [f"# cgroup v1 host: no equivalent for lxc.cgroup2.{v2_key} = {value}"]


def render(keys: dict, raw: list, dev_root: str, images: str, hook: Path | None = None) -> list[str]:
    """LXC config lines for a PVE config (what PVE's update_lxc_config emits, for the parts the stand-in models)."""
    lines = [f"lxc.uts.name = {keys.get('hostname', 'CT' + keys.get('vmid', ''))}"]
    if "memory" in keys:
        mem = int(keys["memory"]) * MIB
        lines += _cg("memory.max", str(mem))
        swap = int(keys.get("swap", "512")) * MIB
        if CGROUP_V1:
            if Path("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists():
                lines.append(f"lxc.cgroup.memory.memsw.limit_in_bytes = {mem + swap}")
        else:
            lines += _cg("memory.swap.max", str(swap))
    if "cores" in keys:
        n = max(1, min(int(keys["cores"]), os.cpu_count() or 1))
        lines += _cg("cpuset.cpus", f"0-{n - 1}" if n > 1 else "0")
    nodes: list[str] = []  # devN: nodes made in the CT's /dev by an autodev hook, as PVE's lxc-pve-autodev-hook
    for k in sorted(keys, key=lambda x: (len(x), x)):
        if re.fullmatch(r"dev\d+", k):
            d = property_string(keys[k], "path")
            host = device_path(dev_root, d["path"])
            try:
                st = os.stat(host)
            except FileNotFoundError:
                raise ValueError(f"Device {d['path']} does not exist") from None
            if (st.st_mode & 0o170000) not in (0o020000, 0o060000):
                raise ValueError(f"{d['path']} is not a device")
            kind = "b" if (st.st_mode & 0o170000) == 0o060000 else "c"
            perms = "r" if d.get("deny-write") == "1" else "rw"
            major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
            lines += _cg("devices.allow", f"{kind} {major}:{minor} {perms}")
            mode = d.get("mode", f"{st.st_mode & 0o7777:04o}")
            nodes.append(f'mkdir -p "$(dirname "$R{d["path"]}")" && rm -f "$R{d["path"]}" && '
                         f'mknod -m {mode} "$R{d["path"]}" {kind} {major} {minor} && '
                         f'chown {d.get("uid", "0")}:{d.get("gid", "0")} "$R{d["path"]}"')
        elif re.fullmatch(r"mp\d+", k):
            m = property_string(keys[k], "volume")
            vol = m["volume"]
            src = vol if vol.startswith("/") else str(Path(images) / vol.split(":", 1)[-1])
            if not vol.startswith("/"):
                Path(src).mkdir(parents=True, exist_ok=True)
            ro = ",ro" if m.get("ro") in ("1", "true", "yes", "on") else ""
            lines.append(f"lxc.mount.entry = {src} {m['mp'].lstrip('/')} none rbind{ro},create=dir 0 0")
    if nodes and hook:
        write_atomic(hook, "#!/bin/sh\n# devN entries of the PVE config (rendered by tests/harness/pve_api)\nset -e\n"
                           'R="$LXC_ROOTFS_MOUNT"\n' + "\n".join(nodes) + "\n")
        os.chmod(hook, 0o755)
        lines.append(f"lxc.hook.autodev = {hook}")
    for k, v in raw:  # raw lines last, as PVE appends them after its own
        if k.startswith("lxc.cgroup2.") and CGROUP_V1:
            lines += _cg(k[len("lxc.cgroup2."):], v)
        else:
            lines.append(f"{k} = {v}")
    return lines


def render_container(vmid: str) -> Path:
    """Rewrite /var/lib/lxc/<vmid>/config from config.base + the PVE file named in its pve_api.json."""
    d = LXC_PATH / str(vmid)
    meta = json.loads((d / MARKER).read_text())
    conf = Path(meta["conf"])
    keys, raw = parse(conf.read_text())
    keys.setdefault("vmid", str(vmid))
    lines = render(keys, raw, meta["dev_root"], meta["images"], d / "pve-devices.hook")
    base = (d / "config.base").read_text()
    text = base.rstrip("\n") + f"\n\n# rendered by tests/harness/pve_api from {conf}\n" + "\n".join(lines) + "\n"
    write_atomic(d / "config", text)
    # PVE writes the CT's /etc/hostname at start; a snapshot clone's upper layer gets it here
    etc = d / "overlay" / "delta" / "etc"
    if etc.parent.is_dir():
        etc.mkdir(exist_ok=True)
        (etc / "hostname").write_text(keys.get("hostname", f"CT{vmid}") + "\n")
    return d / "config"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "render":
        try:
            render_container(argv[1])
        except (OSError, ValueError, KeyError) as e:
            print(f"unable to render LXC config of CT {argv[1]}: {e}", file=sys.stderr)
            return 1
        return 0
    print("usage: pveconf.py render <vmid>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
