# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The Proxmox VE API through proxmoxer: connection options (declared once), one-line errors, task waits.

PVE answers errors with the message as the HTTP reason phrase (docs/proxmox.md): proxmoxer's ResourceException carries it
as `content`; 401 has an empty body; "does not exist" is a 500.
"""

from __future__ import annotations

import re
import time
import traceback

from ansible.module_utils.basic import env_fallback

from ansible_collections.dflash.ops.plugins.module_utils._dflash.argument_spec import ArgumentSpec

try:
    import requests
    from proxmoxer import AuthenticationError, ProxmoxAPI, ResourceException
except ImportError:
    HAS_PROXMOXER = False
    PROXMOXER_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_PROXMOXER = True
    PROXMOXER_IMPORT_ERROR = None

ROOT = "root@pam"


def proxmox_api_argument_spec():
    """The API connection options every Proxmox module shares (documented in doc_fragments/proxmox_api.py)."""
    return ArgumentSpec(
        argument_spec=dict(
            api_host=dict(type="str", required=True, fallback=(env_fallback, ["PROXMOX_HOST"])),
            api_port=dict(type="int", default=8006),
            api_user=dict(type="str", fallback=(env_fallback, ["PROXMOX_USER"])),
            api_password=dict(type="str", no_log=True, fallback=(env_fallback, ["PROXMOX_PASSWORD"])),
            api_token_id=dict(type="str", fallback=(env_fallback, ["PROXMOX_TOKEN_ID"])),
            api_token_secret=dict(type="str", no_log=True, fallback=(env_fallback, ["PROXMOX_TOKEN_SECRET"])),
            validate_certs=dict(type="bool", default=True),
            ca_path=dict(type="path", fallback=(env_fallback, ["PROXMOX_CA_PATH"])),
            api_timeout=dict(type="int", default=30),
        ),
        required_together=[("api_token_id", "api_token_secret")],
    )


class ApiError(Exception):
    """A one-line refusal or failure, ready for fail_json(msg=…)."""


def caller(p):
    """(user, token name or None) the API will see: a token's caller is USER@REALM!TOKEN, never plain USER@REALM."""
    token = p.get("api_token_id")
    if token:
        if "!" in token:
            user, name = token.split("!", 1)
            return user, name
        return p.get("api_user") or ROOT, token
    return p.get("api_user") or ROOT, None


def caller_name(p):
    user, token = caller(p)
    return "%s!%s" % (user, token) if token else user


class Api(object):
    """A connected API client; every call's failure becomes an ApiError naming the fix."""

    def __init__(self, p, sleep=time.sleep, clock=time.monotonic):
        if not HAS_PROXMOXER:
            raise ApiError("the proxmoxer and requests Python packages are needed where this module runs: pip install "
                           "proxmoxer requests (the collection's requirements.txt)")
        self.url = "https://%s:%d" % (p["api_host"], p["api_port"])
        self.who = caller_name(p)
        self.sleep, self.clock = sleep, clock
        verify = (p["ca_path"] or True) if p["validate_certs"] else False
        user, token = caller(p)
        if not token and not p["api_password"]:
            raise ApiError("no API credentials: set api_password (for %s) or api_token_id and api_token_secret "
                           "(or PROXMOX_PASSWORD / PROXMOX_TOKEN_ID, PROXMOX_TOKEN_SECRET)" % user)
        kwargs = dict(port=p["api_port"], user=user, verify_ssl=verify, timeout=p["api_timeout"])
        if token:
            kwargs.update(token_name=token, token_value=p["api_token_secret"])
        else:
            kwargs.update(password=p["api_password"])
        self.px = self.guard(lambda: ProxmoxAPI(p["api_host"], **kwargs), "log in")

    def guard(self, call, what):
        try:
            return call()
        except AuthenticationError:
            raise ApiError(self.bad_credentials())
        except ResourceException as exc:
            if exc.status_code == 401:
                raise ApiError(self.bad_credentials())
            raise ApiError("%s: %s" % (what, reason(exc)))
        except requests.exceptions.SSLError as exc:
            raise ApiError("TLS verification of %s failed (%s): set ca_path to the CA that signed the host's "
                           "certificate (/etc/pve/pve-root-ca.pem on the host), or validate_certs=false"
                           % (self.url, short(exc)))
        except requests.exceptions.RequestException as exc:
            raise ApiError("cannot reach the Proxmox API at %s (%s): check api_host and api_port"
                           % (self.url, short(exc)))

    def bad_credentials(self):
        return ("authentication as %s at %s failed (401): check api_user/api_password or api_token_id/"
                "api_token_secret (env PROXMOX_USER, PROXMOX_PASSWORD, PROXMOX_TOKEN_ID, PROXMOX_TOKEN_SECRET)"
                % (self.who, self.url))

    def get(self, path, what=None, **params):
        return self.guard(lambda: self.px(path).get(**params), what or "GET /" + path)

    def post(self, path, what=None, **data):
        return self.guard(lambda: self.px(path).post(**data), what or "POST /" + path)

    def put(self, path, what=None, **data):
        return self.guard(lambda: self.px(path).put(**data), what or "PUT /" + path)

    def delete(self, path, what=None, **params):
        return self.guard(lambda: self.px(path).delete(**params), what or "DELETE /" + path)

    def wait_task(self, node, upid, timeout, what):
        """Poll the task until it stops; its record {type, upid, exitstatus, seconds}; ApiError with its text when
        it did not end OK (WARNINGS count as OK)."""
        start = self.clock()
        delay = 0.2
        while True:
            status = self.get("nodes/%s/tasks/%s/status" % (node, upid), what + ": task status")
            if status.get("status") == "stopped":
                break
            if self.clock() - start > timeout:
                raise ApiError("%s: task %s still running after %ds: see it in the task log on %s, raise task_timeout"
                               % (what, upid, timeout, node))
            self.sleep(delay)
            delay = min(delay * 1.5, 2.0)
        record = dict(type=status.get("type"), upid=upid, exitstatus=status.get("exitstatus"),
                      seconds=round(self.clock() - start, 2))
        exit_status = str(status.get("exitstatus") or "")
        if exit_status != "OK" and not exit_status.startswith("WARNINGS"):
            raise ApiError("%s failed: %s (task %s)" % (what, exit_status.strip() or "no exit status", upid))
        return record


def reason(exc):
    """PVE's message of a ResourceException: the reason phrase, plus per-parameter errors for a 400."""
    text = str(exc.content or "").strip() or str(exc.status_message or "")
    if exc.errors:
        errors = exc.errors if isinstance(exc.errors, dict) else {"": exc.errors}
        text += " (" + "; ".join(("%s: %s" % (k, str(v).strip())) if k else str(v).strip()
                                 for k, v in sorted(errors.items())) + ")"
    return "%d %s" % (exc.status_code, " ".join(text.split()))


def short(exc):
    text = str(exc)
    m = re.search(r"\[SSL[^\]]*\][^')\"]*|Connection refused|Name or service not known|timed out", text)
    return m.group(0).strip() if m else " ".join(text.split())[:200]


def version_tuple(text):
    """"8.2.4" → (8, 2, 4); unparsable parts count as 0."""
    return tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.\-]", str(text))[:3])
