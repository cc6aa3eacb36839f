"""CLI: start | stop | serve (see the package docstring). Run from tests/ as `python -m harness.pve_api …`."""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from .. import HARNESS_DIR
from . import STATE_FILE

TESTS_DIR = HARNESS_DIR.parent


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m harness.pve_api")
    ap.add_argument("command", choices=["start", "stop", "serve"])
    ap.add_argument("state_dir", type=Path)
    ap.add_argument("--node", default="pve1")
    ap.add_argument("--vm", type=int, action="append", default=[], help="a VM (qemu) vmid listed on the node")
    ap.add_argument("--pve-version", default="8.2.4")
    ap.add_argument("--gpus", type=int, default=8, help="stand-in /dev/nvidia<N> character devices to make")
    ap.add_argument("--next-id", type=int, default=300, help="lower bound of /cluster/nextid (datacenter next-id)")
    ap.add_argument("--timeout", type=float, default=300)
    return ap.parse_args(argv)


def make_cert(cert: Path, key: Path) -> None:
    """Self-signed certificate for 127.0.0.1/localhost (its own CA: ca_cert in the state file is this file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pve-api stand-in 127.0.0.1"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dflash test harness")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ski = x509.SubjectKeyIdentifier.from_public_key(k.public_key())
    c = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                      content_commitment=False, key_encipherment=False, data_encipherment=False,
                                      key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
         .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                     x509.DNSName("localhost")]), critical=False)
         .add_extension(ski, critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
         .sign(k, hashes.SHA256()))
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    os.chmod(key, 0o600)
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))


def serve(a: argparse.Namespace) -> int:
    from .. import golden
    from .api import Context
    from .backend import Backend, make_stand_in_devices
    from .server import Auth, Server
    from .tasks import Tasks

    state = a.state_dir.resolve()
    node_dir = state / "nodes" / a.node
    (node_dir / "lxc").mkdir(parents=True, exist_ok=True)
    for link, target in (("lxc", f"nodes/{a.node}/lxc"), ("local", f"nodes/{a.node}")):
        if not (state / link).is_symlink():
            (state / link).symlink_to(target)
    cert, key = node_dir / "pve-ssl.pem", node_dir / "pve-ssl.key"
    make_cert(cert, key)
    dev_root = state / "dev"
    make_stand_in_devices(dev_root, a.gpus)
    log_fh = open(state / "pve_api.log", "a", buffering=1)

    def log(msg: str) -> None:
        log_fh.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

    info = {"node": a.node, "root_password": secrets.token_urlsafe(12), "token_id": "root@pam!ci",
            "token_secret": secrets.token_hex(16)}
    g = golden.build()["name"]
    backend = Backend(state, a.node, dev_root, g)
    ctx = Context(a.node, a.pve_version, backend, Tasks(a.node), {v: f"vm{v}" for v in a.vm}, a.next_id)
    srv = Server(("127.0.0.1", 0), ctx, Auth(info["root_password"], info["token_id"], info["token_secret"]), log)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    port = srv.server_address[1]
    info = {"url": f"https://127.0.0.1:{port}", "host": "127.0.0.1", "port": port, "ca_cert": str(cert),
            **info, "pve_dir": str(state), "dev_root": str(dev_root), "pid": os.getpid()}
    tmp = state / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, state / STATE_FILE)
    log(f"serving {info['url']} node {a.node} golden {g} vms {sorted(ctx.vms)}")
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown, daemon=True).start())
    srv.serve_forever(poll_interval=0.2)
    ctx.tasks.wait_all(30)
    log("stopped")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and b"harness.pve_api" in Path(f"/proc/{pid}/cmdline").read_bytes()


def start(a: argparse.Namespace, argv: list[str]) -> int:
    state = a.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    (state / STATE_FILE).unlink(missing_ok=True)
    args = [sys.executable, "-m", "harness.pve_api", "serve", str(state), *argv[2:]]
    with open(state / "pve_api.log", "ab") as out:
        proc = subprocess.Popen(args, cwd=TESTS_DIR, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + a.timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"pve_api server exited {proc.returncode}: "
                  f"{(state / 'pve_api.log').read_text()[-3000:]}", file=sys.stderr)
            return 1
        f = state / STATE_FILE
        if f.exists():
            info = json.loads(f.read_text())
            try:
                ctx = ssl.create_default_context(cafile=info["ca_cert"])
                req = urllib.request.Request(info["url"] + "/api2/json/version", headers={
                    "Authorization": f"PVEAPIToken={info['token_id']}={info['token_secret']}"})
                with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                    if r.status == 200:
                        print(json.dumps(info))
                        return 0
            except OSError:
                pass
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    print(f"pve_api server did not answer within {a.timeout}s", file=sys.stderr)
    return 1


def stop(a: argparse.Namespace) -> int:
    from .. import golden
    from .backend import Backend, machine_lock

    state = a.state_dir.resolve()
    f = state / STATE_FILE
    if not f.exists():
        return 0
    info = json.loads(f.read_text())
    pid = info.get("pid")
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 40
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    backend = Backend(state, info["node"], Path(info["dev_root"]), golden.name())
    gone = []
    with machine_lock():
        for vmid in backend.vmids():
            backend.destroy(vmid)
            gone.append(vmid)
    f.unlink(missing_ok=True)
    print(json.dumps({"stopped": pid, "destroyed": gone}))
    return 0


def main(argv: list[str]) -> int:
    a = parse(argv)
    if a.command == "serve":
        return serve(a)
    if a.command == "start":
        return start(a, argv)
    return stop(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
