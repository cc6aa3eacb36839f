"""An sshd on 127.0.0.1 standing in for the Proxmox host's sshd.

Own config, host key, client key pair (generated per session under a temp dir), free port, key-only root login.
Started with `/usr/sbin/sshd -D -f <conf>` and stopped by its pid (and the pids of its session children).

PATH: sshd resets PATH for a session. The harness sets `SetEnv PATH=<tests/harness/bin>:/usr/sbin:/usr/bin:/sbin:/bin`
in the sshd config, so a non-interactive `ssh host pct ...` finds the stand-in the way a real Proxmox host finds
/usr/sbin/pct -- and the module's default `pct_path: pct` (PATH lookup) is what gets tested. `with_pct=False` gives an
sshd whose sessions have no pct at all (the "pct missing on host" fault).

CLI (for Molecule's create/destroy):  python -m harness.sshd start <state-dir> | stop <state-dir>
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import BIN_DIR

SSHD = "/usr/sbin/sshd"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sshd:
    def __init__(self, state_dir: Path, with_pct: bool = True, port: int | None = None):
        self.dir = Path(state_dir)
        self.with_pct = with_pct
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        self.key = self.dir / "id_ed25519"
        self.conf = self.dir / "sshd_config"
        self.log = self.dir / "sshd.log"

    # --- setup -----------------------------------------------------------------------------------------------
    def _keys(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        host_key = self.dir / "ssh_host_ed25519_key"
        for k in (host_key, self.key):
            if not k.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dflash-harness", "-f", str(k)],
                               check=True)
        (self.dir / "authorized_keys").write_text((self.dir / "id_ed25519.pub").read_text())
        os.chmod(self.dir / "authorized_keys", 0o600)

    def path_env(self) -> str:
        return f"{BIN_DIR}:{SYSTEM_PATH}" if self.with_pct else SYSTEM_PATH

    def _config(self) -> None:
        # SHLVL=1: bash started by sshd sources ~/.bashrc only as a top-level shell (SHLVL < 2). This machine's
        # .bashrc runs `pyenv init` and `pyenv rehash`: ~100 CPU-s of a test command's run went to them (process
        # accounting, 2026-12-03). A Proxmox host's root shell is not the harness's concern.
        self.conf.write_text(f"""\
# dflash harness sshd: 127.0.0.1 only, key-only root login
Port {self.port}
ListenAddress 127.0.0.1
HostKey {self.dir}/ssh_host_ed25519_key
PidFile {self.dir}/sshd.pid
AuthorizedKeysFile {self.dir}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
LogLevel INFO
MaxStartups 50:30:100
MaxSessions 50
Subsystem sftp internal-sftp
SetEnv PATH={self.path_env()} SHLVL=1
""")

    def start(self, timeout: float = 15) -> "Sshd":
        self._keys()
        self._config()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir (no systemd to make it)
        subprocess.run([SSHD, "-t", "-f", str(self.conf)], check=True)
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.conf)], stdin=subprocess.DEVNULL,
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid
        (self.dir / "state.json").write_text(json.dumps(self.info()))
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sshd on port {self.port} did not answer in {timeout}s")
            time.sleep(0.05)
        return self

    def children(self) -> list[int]:
        """Pids of the session processes sshd forked (direct children of our sshd)."""
        if not self.pid:
            return []
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == self.pid:
                    out.append(int(d.name))
        return out

    def stop(self) -> None:
        if not self.pid:
            return
        kids = self.children()
        for pid in [self.pid, *kids]:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        else:
            _wait_gone(self.pid)
        self.pid = None

    # --- client side -------------------------------------------------------------------------------------------
    def ssh_options(self) -> list[str]:
        return ["-i", str(self.key), "-p", str(self.port), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
                "-o", "IdentitiesOnly=yes"]

    def ssh_argv(self, *remote: str, tty: bool = False) -> list[str]:
        return ["ssh", *(["-tt"] if tty else []), *self.ssh_options(), "root@127.0.0.1", *remote]

    def ssh(self, *remote: str, tty: bool = False, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.ssh_argv(*remote, tty=tty), text=True, timeout=timeout,
                              stdin=kw.pop("stdin", subprocess.DEVNULL), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, **kw)

    def info(self) -> dict:
        return {"port": self.port, "pid": self.pid, "key": str(self.key), "dir": str(self.dir),
                "with_pct": self.with_pct}

    def env(self) -> dict:
        """Environment variables the harness inventory (inventories/harness) reads."""
        return {"DFLASH_HARNESS_SSH_PORT": str(self.port), "DFLASH_HARNESS_SSH_KEY": str(self.key)}


def _wait_gone(pid: int, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__, file=sys.stderr)
        return 2
    d = Path(argv[1])
    if argv[0] == "start":
        s = Sshd(d).start()
        print(json.dumps(s.info()))
        # detach: the Popen object dies with us, the sshd (own session) keeps running; stop uses the pid file.
    else:
        st = d / "state.json"
        if st.exists():
            info = json.loads(st.read_text())
            s = Sshd(d, port=info["port"])
            s.pid = info["pid"]
            if s.pid and Path(f"/proc/{s.pid}").exists() and "sshd" in Path(f"/proc/{s.pid}/cmdline").read_text(
                    errors="replace") and str(d) in Path(f"/proc/{s.pid}/cmdline").read_text(errors="replace"):
                s.stop()
            st.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
