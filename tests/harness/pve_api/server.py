"""HTTPS request handling: auth (ticket + CSRF, API tokens), PVE's response shapes, the routes of docs/proxmox.md."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import api
from .schema import ApiError

PREFIX = "/api2/json"
TICKET_LIFETIME = 7200


class Auth:
    def __init__(self, root_password: str, token_id: str, token_secret: str):
        self.root_password = root_password
        self.token_id = token_id  # "root@pam!ci"
        self.token_secret = token_secret
        self.key = secrets.token_bytes(32)

    def _sig(self, text: str) -> str:
        return base64.b64encode(hmac.new(self.key, text.encode(), hashlib.sha256).digest()).decode()

    def ticket(self, user: str) -> tuple[str, str]:
        ts = f"{int(time.time()):08X}"
        plain = f"PVE:{user}:{ts}"
        return f"{plain}::{self._sig(plain)}", f"{ts}:{self._sig(ts + ':' + user)}"

    def ticket_user(self, ticket: str) -> str | None:
        m = re.fullmatch(r"(PVE:([^:]+):([0-9A-F]{8}))::(.+)", ticket or "")
        if not m or not hmac.compare_digest(self._sig(m.group(1)), m.group(4)):
            return None
        if time.time() - int(m.group(3), 16) > TICKET_LIFETIME:
            return None
        return m.group(2)

    def csrf_ok(self, token: str, user: str) -> bool:
        ts, _, sig = (token or "").partition(":")
        return bool(re.fullmatch(r"[0-9A-F]{8}", ts)) and hmac.compare_digest(self._sig(ts + ":" + user), sig) \
            and time.time() - int(ts, 16) <= TICKET_LIFETIME

    def login(self, username: str, password: str) -> str | None:
        if username == "root@pam" and hmac.compare_digest(password.encode(), self.root_password.encode()):
            return "root@pam"
        if self.ticket_user(password) == username:  # ticket renewal: the old ticket as password
            return username
        return None

    def token_user(self, header: str) -> str | None:
        m = re.fullmatch(r"PVEAPIToken[= ]([^=]+)=(.+)", header or "")
        if m and m.group(1) == self.token_id and hmac.compare_digest(m.group(2).encode(), self.token_secret.encode()):
            return m.group(1)
        return None


def reason(text: str) -> str:
    """A PVE message as an HTTP reason phrase: one line, latin-1."""
    return " ".join(text.split()).encode("latin-1", "replace").decode("latin-1")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "pve-api-handler"
    sys_version = ""

    def log_message(self, fmt, *args):  # quiet; the access log is the server's log file
        self.server.log(f"{self.address_string()} {fmt % args}")

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_DELETE(self):
        self._handle("DELETE")

    # ----------------------------------------------------------------------------------------------------------
    def _params(self, query: str) -> dict:
        params = {k: v[-1] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        if body:
            ctype = self.headers.get("Content-Type", "")
            if "json" in ctype:
                data = json.loads(body)
                params.update({k: v for k, v in data.items()})
            else:
                params.update({k: v[-1] for k, v in urllib.parse.parse_qs(body.decode(),
                                                                          keep_blank_values=True).items()})
        return params

    def _send(self, status: int, phrase: str | None, body: bytes, extra: dict | None = None) -> None:
        self.send_response(status, phrase)
        if body:
            self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=0")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _handle(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        try:
            params = self._params(url.query)
        except (ValueError, UnicodeDecodeError):
            self._send(400, "malformed request body", b"")
            return
        srv = self.server
        try:
            if not url.path.startswith(PREFIX + "/"):
                raise ApiError(501, f"Method '{method} {url.path}' not implemented")
            rel = urllib.parse.unquote(url.path[len(PREFIX):]).rstrip("/") or "/"
            if rel == "/access/ticket" and method == "POST":
                data = self._ticket(params)
            else:
                user = self._authenticate(method)
                if user is None:
                    return
                data = api.dispatch(srv.ctx, method, rel, params, user)
            self._send(200, None, json.dumps({"data": data}).encode())
        except ApiError as e:
            if e.status == 401:
                self._auth_fail(reason(e.message))
                return
            body = {"data": None, "message": e.message + "\n"}
            if e.errors:
                body["errors"] = e.errors
            self._send(e.status, reason(e.message), json.dumps(body).encode())
        except Exception as e:  # noqa: BLE001 - PVE answers any die() with 500 and the text
            srv.log(f"500 on {method} {url.path}: {type(e).__name__}: {e}")
            msg = f"{e}"
            self._send(500, reason(msg), json.dumps({"data": None, "message": msg + "\n"}).encode())

    def _auth_fail(self, phrase: str) -> None:
        self._send(401, phrase, b"")  # PVE: auth failures are 401 with an empty body

    def _authenticate(self, method: str) -> str | None:
        auth: Auth = self.server.auth
        header = self.headers.get("Authorization")
        if header and header.startswith("PVEAPIToken"):
            user = auth.token_user(header)
            if user is None:
                self._auth_fail("invalid token value!")
            return user  # no CSRF with a token
        cookies = {}
        for part in (self.headers.get("Cookie") or "").split(";"):
            k, _, v = part.strip().partition("=")
            cookies[k] = urllib.parse.unquote(v)
        ticket = cookies.get("PVEAuthCookie")
        if not ticket:
            self._auth_fail("No ticket")
            return None
        user = auth.ticket_user(ticket)
        if user is None:
            self._auth_fail("authentication failure")
            return None
        if method != "GET" and not auth.csrf_ok(self.headers.get("CSRFPreventionToken", ""), user):
            self._auth_fail("Permission denied - invalid csrf token")
            return None
        return user

    def _ticket(self, params: dict) -> dict:
        username, password = str(params.get("username", "")), str(params.get("password", ""))
        if params.get("realm") and "@" not in username:
            username = f"{username}@{params['realm']}"
        user = self.server.auth.login(username, password)
        if user is None:
            raise _Unauthorized()
        ticket, csrf = self.server.auth.ticket(user)
        return {"username": user, "ticket": ticket, "CSRFPreventionToken": csrf,
                "cap": {"vms": {"VM.Allocate": 1, "VM.Config.Options": 1, "VM.PowerMgmt": 1},
                        "nodes": {"Sys.Audit": 1, "Sys.Modify": 1}, "access": {}, "dc": {}, "storage": {}}}


class _Unauthorized(ApiError):
    def __init__(self):
        super().__init__(401, "authentication failure")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, ctx, auth: Auth, log):
        super().__init__(addr, Handler)
        self.ctx = ctx
        self.auth = auth
        self.log = log

    def handle_error(self, request, client_address):
        self.log(f"connection error from {client_address}")
