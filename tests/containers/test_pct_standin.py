"""The pct stand-in (tests/harness/bin/pct) behaves as docs/proxmox.md says, reached through the harness sshd."""
import pytest

from harness import PCT, lxc

pytestmark = pytest.mark.containers


def pct(sshd, *args, tty=False):
    """Run `pct ...` on the harness host over ssh (PATH from the sshd's SetEnv, as on a PVE host)."""
    return sshd.ssh("pct " + " ".join(args), tty=tty)


def test_pct_found_through_ssh_path(sshd):
    p = sshd.ssh("command -v pct")
    assert p.stdout.strip() == str(PCT)


def test_missing_container(sshd, golden):
    lxc.destroy("999")
    for sub in ("exec 999 -- true", "status 999", "start 999", "config 999", "push 999 /etc/hostname /x"):
        p = pct(sshd, sub)
        assert p.returncode == 255, (sub, p)
        assert p.stderr.strip().startswith("Configuration file 'nodes/") and "/lxc/999.conf' does not exist" in p.stderr
    p = pct(sshd, "stop 999")
    assert (p.returncode, p.stderr.strip()) == (255, "CT 999 not running")


def test_lifecycle_messages_and_status(sshd, ct200):
    assert pct(sshd, "status 200").stdout == "status: running\n"
    p = pct(sshd, "start 200")
    assert (p.returncode, p.stderr.strip()) == (255, "CT 200 already running")
    p = pct(sshd, "stop 200")
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
    assert pct(sshd, "status 200").stdout == "status: stopped\n"
    p = pct(sshd, "exec 200 -- true")
    assert (p.returncode, p.stderr.strip()) == (255, "container '200' not running!")
    p = pct(sshd, "push 200 /etc/hostname /root/h")
    assert (p.returncode, p.stderr.strip()) == (255, "can only push files to a running CT")
    p = pct(sshd, "stop 200")
    assert (p.returncode, p.stderr.strip()) == (255, "CT 200 not running")
    p = pct(sshd, "start 200")
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
    assert pct(sshd, "status 200").stdout == "status: running\n"


def test_exec_exit_status_and_env(sshd, ct200):
    assert pct(sshd, "exec 200 -- sh -c 'exit 7'").returncode == 7
    assert pct(sshd, "exec 200 -- /nonexistent/cmd").returncode == 127
    assert pct(sshd, "exec 200 -- sh -c 'kill -9 $$'").returncode == 137
    p = pct(sshd, "exec 200")
    assert (p.returncode, p.stderr.strip()) == (255, "missing command")
    # runs inside the container (its own hostname and pid namespace)
    assert pct(sshd, "exec 200 -- hostname").stdout.strip() == "200"
    # --keep-env 1 (default) passes the caller's environment, 0 clears it; SSL_CERT_FILE is always dropped
    p = sshd.ssh("FOO=bar SSL_CERT_FILE=/x pct exec 200 -- env")
    assert "FOO=bar" in p.stdout and "SSL_CERT_FILE" not in p.stdout
    p = sshd.ssh("FOO=bar pct exec 200 --keep-env 0 -- env")
    assert "FOO=bar" not in p.stdout


def test_exec_terminal_only_with_caller_terminal(sshd, ct200):
    assert pct(sshd, "exec 200 -- tty").stdout.strip() == "not a tty"
    p = pct(sshd, "exec 200 -- tty", tty=True)
    assert p.stdout.strip().startswith("/dev/pts/"), p.stdout


def test_push_pull_config_set(sshd, ct200, tmp_path):
    src = tmp_path / "f.txt"
    src.write_text("payload\n")
    p = pct(sshd, f"push 200 {src} /root/f.txt --perms 0600")
    assert p.returncode == 0, p.stderr
    assert ct200.read("/root/f.txt") == "payload\n"
    assert ct200.sh("stat -c %a /root/f.txt").stdout.strip() == "600"
    p = pct(sshd, f"push 200 {src} relative.txt")
    assert p.returncode == 255
    dst = tmp_path / "back.txt"
    assert pct(sshd, f"pull 200 /root/f.txt {dst}").returncode == 0
    assert dst.read_text() == "payload\n"
    assert pct(sshd, f"pull 200 /root/missing {tmp_path}/x").returncode == 255
    assert pct(sshd, "set 200 --memory 2048 --cores 2").stdout == ""
    conf = pct(sshd, "config 200").stdout.splitlines()
    keys = [l.split(":")[0] for l in conf if not l.startswith("lxc.")]
    assert keys == sorted(keys) and "memory: 2048" in conf and "cores: 2" in conf
    assert "lxc.net.0.type: empty" in conf
    pct(sshd, "set 200 --delete cores")
    assert "cores: 2" not in pct(sshd, "config 200").stdout
    pct(sshd, "set 200 --lock backup")
    p = pct(sshd, "stop 200")
    assert (p.returncode, p.stderr.strip()) == (255, "CT is locked (backup)")
    assert pct(sshd, "exec 200 -- true").returncode == 0  # exec has no lock check
