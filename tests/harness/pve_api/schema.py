"""Parameter verification and the root@pam-only rules of PVE's container API (docs/proxmox.md; texts from
pve-common's JSONSchema and pve-container's check_ct_modify_config_perm)."""
from __future__ import annotations

import re

from . import pveconf

NOT_IN_SCHEMA = "property is not defined in schema and the schema does not allow additional properties"
MISSING = "property is missing and it is not optional"

# container config keys (pve-container's confdesc, the subset a GPU training CT uses plus the common rest)
INT_KEYS = {"cores": (1, 8192), "memory": (16, None), "swap": (0, None), "cpuunits": (0, 500000),
            "tty": (0, 6)}
BOOL_KEYS = {"unprivileged", "onboot", "protection", "template", "console", "debug"}
STR_KEYS = {"hostname", "rootfs", "features", "arch", "ostype", "nameserver", "searchdomain", "description",
            "tags", "timezone", "hookscript", "startup", "cmode", "lock", "cpulimit", "entrypoint", "env"}
INDEXED = {"dev": 255, "mp": 255, "net": 31, "unused": 255}
CREATE_ONLY_STR = {"ostemplate", "password", "ssh-public-keys", "storage", "pool"}
CREATE_ONLY_BOOL = {"start", "force", "unique", "ignore-unpack-errors", "restore"}
UPDATE_ONLY = {"delete", "digest", "revert"}
BOOL_TRUE = {"1", "true", "yes", "on"}
BOOL_FALSE = {"0", "false", "no", "off"}
HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}"
                         r"[a-zA-Z0-9])?)*$")


class ApiError(Exception):
    def __init__(self, status: int, message: str, errors: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors


def param_error(errors: dict) -> ApiError:
    return ApiError(400, "Parameter verification failed.", errors)


def indexed(key: str) -> str | None:
    m = re.fullmatch(r"([a-z]+)(\d+)", key)
    if m and m.group(1) in INDEXED and int(m.group(2)) <= INDEXED[m.group(1)]:
        return m.group(1)
    return None


def check_int(v: str, lo: int | None, hi: int | None) -> tuple[int | None, str | None]:
    if not re.fullmatch(r"[+-]?\d+", str(v)):
        return None, f"type check ('integer') failed - got '{v}'"
    n = int(v)
    if lo is not None and n < lo:
        return None, f"value must have a minimum value of {lo}"
    if hi is not None and n > hi:
        return None, f"value must have a maximum value of {hi}"
    return n, None


def check_bool(v: str) -> tuple[int | None, str | None]:
    s = str(v).lower()
    if s in BOOL_TRUE:
        return 1, None
    if s in BOOL_FALSE:
        return 0, None
    return None, f"type check ('boolean') failed - got '{v}'"


def vmid(v: str) -> int:
    n, err = check_int(v, 100, 999999999)
    if err:
        raise param_error({"vmid": err})
    return n


def verify(params: dict, create: bool, devices: bool = True) -> dict:
    """Normalise a create/update parameter set (ints and 0/1 booleans as strings, as PVE writes them).
    `devices=False`: a host older than PVE 8.1 (pve-container < 5.0.7), whose schema has no devN."""
    errors: dict[str, str] = {}
    out: dict[str, str] = {}
    for k, v in params.items():
        v = str(v)
        err = None
        if k in INT_KEYS:
            n, err = check_int(v, *INT_KEYS[k])
            v = str(n)
        elif k in BOOL_KEYS or (create and k in CREATE_ONLY_BOOL):
            n, err = check_bool(v)
            v = str(n)
        elif k in STR_KEYS or (create and k in CREATE_ONLY_STR) or (not create and k in UPDATE_ONLY):
            if k == "hostname" and not HOSTNAME_RE.match(v):
                err = "invalid format - value does not look like a valid DNS name"
        elif k == "vmid" and create:
            n, err = check_int(v, 100, 999999999)
            v = str(n)
        elif indexed(k) and (devices or indexed(k) != "dev"):
            err = check_indexed(indexed(k), v)
        else:
            err = NOT_IN_SCHEMA  # raw lxc.* keys land here: not in the API at all, for everyone
        if err:
            errors[k] = err
        else:
            out[k] = v
    if create:
        for k in ("vmid", "ostemplate"):
            if k not in params:
                errors[k] = MISSING
    if errors:
        raise param_error(errors)
    return out


def check_indexed(kind: str, v: str) -> str | None:
    try:
        if kind == "dev":
            d = pveconf.property_string(v, "path")
            p = d.get("path", "")
            if not p.startswith("/dev/") or re.search(r"/\.\.?(/|$)", p):
                return f"invalid format - {p} is not a valid device path"
            for opt in ("uid", "gid"):
                if opt in d and not d[opt].isdigit():
                    return f"invalid format - {opt}: type check ('integer') failed - got '{d[opt]}'"
            if "mode" in d and not re.fullmatch(r"0?[0-7]{3,4}", d["mode"]):
                return "invalid format - mode: value does not match the regex pattern"
        elif kind == "mp":
            d = pveconf.property_string(v, "volume")
            if "mp" not in d:
                return "invalid format - format error\nmp: property is missing and it is not optional"
            if not d["mp"].startswith("/"):
                return "invalid format - mount point path must be absolute"
    except ValueError as e:
        return str(e)
    return None


def mp_type(value: str) -> str:
    vol = pveconf.property_string(value, "volume").get("volume", "")
    if vol.startswith("/dev/"):
        return "device"
    return "bind" if vol.startswith("/") else "volume"


def features(value: str | None) -> dict:
    return pveconf.property_string(value, "nesting") if value else {}


def check_modify_perm(user: str, new: dict, delete: list, old: dict | None, unprivileged: bool) -> None:
    """pve-container check_ct_modify_config_perm: what only the exact user root@pam may do (403)."""
    if user == "root@pam":
        return
    for opt in [*new, *delete]:
        deleting = opt in delete and opt not in new
        if opt == "rootfs" or indexed(opt) == "mp":
            if not deleting and mp_type(new[opt]) != "volume":
                perm_exc(f"mount point type {mp_type(new[opt])} is only allowed for root@pam")
        elif indexed(opt) == "dev":
            perm_exc("configuring device passthrough is only allowed for root@pam")
        elif opt == "features":
            if not unprivileged:
                perm_exc("changing feature flags for privileged container is only allowed for root@pam")
            old_f = features((old or {}).get("features"))
            new_f = {} if deleting else features(new[opt])
            changed = {f for f in {*old_f, *new_f} if old_f.get(f) != new_f.get(f)}
            if changed - {"nesting"}:
                perm_exc("changing feature flags (except nesting) is only allowed for root@pam")
        elif opt == "hookscript":
            perm_exc("changing the hookscript is only allowed for root@pam")


def perm_exc(what: str) -> None:
    raise ApiError(403, f"Permission check failed ({what})")
