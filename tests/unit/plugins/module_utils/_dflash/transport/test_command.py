"""The transport builds exact argument vectors and maps pct's refusals to one-line errors."""
import os
import stat

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport import command as t

P = t.DEFAULT_PATH


def test_local_argv_is_exact():
    tr = t.Transport("local")
    assert tr.build_argv(["python3", "-c", "print(1)"], env={"A": "1"}) == [
        "env", "-i", "--", "A=1", "PATH=" + P, "python3", "-c", "print(1)"]


def test_pct_argv_is_exact(tmp_path):
    pct = _stand_in(tmp_path, "exit 0")
    tr = t.Transport("pct", vmid=200, pct_path=pct)
    assert tr.build_argv(["nvidia-smi", "-L"], env={"PATH": "/x"}, cwd="/workspace") == [
        pct, "exec", "200", "--", "env", "-i", "-C", "/workspace", "--", "PATH=/x", "nvidia-smi", "-L"]


def test_login_shell_passes_arguments_as_positional_parameters():
    argv = t.Transport("local").build_argv(["echo", "$(id)"], login_shell=True)
    assert argv[-6:] == ["bash", "-lc", 'exec "$@"', "bash", "echo", "$(id)"]


HOSTILE = ["x; touch /tmp/pwned", "$(id)", "`id`", "a'b\"c", "new\nline", "--", "-rf", "*", "~", "\\"]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_run_literally(tmp_path, value):
    canary = tmp_path / "pwned"
    value = value.replace("/tmp/pwned", str(canary))
    tr = t.Transport("local")
    rc, out, _ = tr.run(["printf", "%s", value])
    assert (rc, out) == (0, value)
    rc, out, _ = tr.run(["sh", "-c", 'printf %s "$V"'], env={"V": value})
    assert (rc, out) == (0, value)
    rc, out, _ = tr.run(["printf", "%s", value], login_shell=True)
    assert out == value
    assert not canary.exists()


@pytest.mark.parametrize("name", ["1A", "A B", "A=B", "A;B", "", "A-B", "$(id)", "A\n"])
def test_bad_env_names_are_refused(name):
    with pytest.raises(ValueError, match="invalid environment variable name"):
        t.Transport("local").build_argv(["true"], env={name: "x"})


def test_caller_environment_is_not_passed(monkeypatch):
    monkeypatch.setenv("DFLASH_LEAK_CHECK", "leaked")
    rc, out, _ = t.Transport("local").run(["env"])
    assert "DFLASH_LEAK_CHECK" not in out and out.strip() == "PATH=" + P


@pytest.mark.parametrize("vmid", [None, "abc", 99, "200; id"])
def test_bad_vmid_is_refused(vmid):
    with pytest.raises(ValueError, match="vmid"):
        t.Transport("pct", vmid=vmid)


def test_program_with_equals_sign_is_refused():
    with pytest.raises(ValueError, match="may not contain '='"):
        t.Transport("local").build_argv(["A=B", "x"])


def test_stdin_is_closed_without_data():
    rc, out, _ = t.Transport("local").run(["cat"], timeout=10)
    assert rc == 0 and out == ""


def test_timeout_kills_the_process_group():
    with pytest.raises(t.CommandTimeout, match="did not finish within 0.5s"):
        t.Transport("local").run(["sh", "-c", "sleep 30 & sleep 30"], timeout=0.5)


def _stand_in(tmp_path, body):
    path = tmp_path / "pct"
    path.write_text("#!/bin/sh\n%s\n" % body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_pct_missing_is_a_clear_error(tmp_path):
    tr = t.Transport("pct", vmid=200, pct_path=str(tmp_path / "nowhere" / "pct"))
    with pytest.raises(t.PctNotFound, match="pct not found"):
        tr.run(["true"])
    tr = t.Transport("pct", vmid=200, pct_path="pct-does-not-exist")
    with pytest.raises(t.PctNotFound, match="transport=local"):
        tr.run(["true"])


def test_container_not_running_names_vmid_and_fix(tmp_path):
    # What pve-container prints (docs/proxmox.md): "container '<vmid>' not running!" on stderr, exit 255.
    pct = _stand_in(tmp_path, "echo \"container '$2' not running!\" >&2; exit 255")
    with pytest.raises(t.ContainerNotRunning) as exc:
        t.Transport("pct", vmid=201, pct_path=pct).run(["true"])
    assert "container 201 is not running" in str(exc.value) and "pct start 201" in str(exc.value)


def test_missing_container_is_named(tmp_path):
    pct = _stand_in(tmp_path, "echo \"Configuration file 'nodes/pve/lxc/$2.conf' does not exist\" >&2; exit 255")
    with pytest.raises(t.ContainerMissing, match="container 999 does not exist"):
        t.Transport("pct", vmid=999, pct_path=pct).run(["true"])


def test_command_exit_status_passes_through(tmp_path):
    # A stand-in that execs the command as pct does (after `exec <vmid> --`).
    pct = _stand_in(tmp_path, 'shift 3; exec "$@"')
    rc, out, err = t.Transport("pct", vmid=200, pct_path=pct).run(["sh", "-c", "echo hi; exit 7"])
    assert (rc, out) == (7, "hi\n")
    assert os.path.exists(pct)
