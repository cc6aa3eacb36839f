"""pct_exec through ansible-runner, local transport (the pct path is tested in tests/containers)."""
import pytest

pytestmark = pytest.mark.timeout(60)


def test_argv_runs_literally_with_only_the_given_env(ansible, tmp_path):
    ok, res = ansible.module("dflash.ops.pct_exec", {
        "transport": "local", "argv": ["sh", "-c", 'printf "%s|%s\\n" "$1" "$V"; env', "sh", "$(id); x"],
        "env": {"V": "`id`"}})
    assert ok and res["changed"] and res["rc"] == 0
    assert res["stdout_lines"][0] == "$(id); x|`id`"
    names = set(line.split("=", 1)[0] for line in res["stdout_lines"][1:])
    assert names - {"PWD", "SHLVL", "_"} == {"PATH", "V"}  # (sh adds PWD, SHLVL, _ itself)


def test_cmd_string_is_split_not_run_by_a_shell(ansible, tmp_path):
    canary = tmp_path / "pwned"
    ok, res = ansible.module("dflash.ops.pct_exec", {
        "transport": "local", "cmd": "printf '%%s\\n' 'a b' \"c;touch %s\"" % canary})
    assert ok and res["stdout_lines"] == ["a b", "c;touch %s" % canary]
    assert not canary.exists()


def test_non_zero_exit_fails_unless_expected(ansible):
    ok, res = ansible.module("dflash.ops.pct_exec", {"transport": "local", "argv": ["sh", "-c", "echo oops >&2; exit 4"]})
    assert not ok and res["rc"] == 4 and "status 4" in res["msg"] and "oops" in res["msg"]
    ok, res = ansible.module("dflash.ops.pct_exec", {"transport": "local", "argv": ["sh", "-c", "exit 4"],
                                                    "expected_rc": [0, 4]})
    assert ok and res["rc"] == 4


def test_creates_removes_and_check_mode(ansible, tmp_path):
    target = tmp_path / "made"
    args = {"transport": "local", "argv": ["touch", str(target)], "creates": str(target)}
    ok, res = ansible.module("dflash.ops.pct_exec", args, check=True)
    assert ok and res["changed"] and not target.exists()
    ok, res = ansible.module("dflash.ops.pct_exec", args)
    assert ok and res["changed"] and target.exists()
    ok, res = ansible.module("dflash.ops.pct_exec", args)
    assert ok and not res["changed"] and "exists" in res["skipped_reason"]
    ok, res = ansible.module("dflash.ops.pct_exec", {"transport": "local", "argv": ["rm", str(target)],
                                                    "removes": str(target)})
    assert ok and res["changed"] and not target.exists()
    ok, res = ansible.module("dflash.ops.pct_exec", {"transport": "local", "argv": ["rm", str(target)],
                                                    "removes": str(target)})
    assert ok and not res["changed"]


def test_chdir_and_login_shell(ansible, tmp_path):
    ok, res = ansible.module("dflash.ops.pct_exec", {"transport": "local", "argv": ["pwd"], "chdir": str(tmp_path),
                                                    "login_shell": True})
    assert ok and res["stdout"].strip() == str(tmp_path)


def test_timeout_is_a_clear_error(ansible):
    ok, res = ansible.module("dflash.ops.pct_exec", {"transport": "local", "argv": ["sleep", "30"], "timeout": 1})
    assert not ok and "did not finish within 1.0s" in res["msg"]


def test_pct_transport_without_pct_is_a_one_line_error(ansible):
    ok, res = ansible.module("dflash.ops.pct_exec", {"vmid": 200, "argv": ["true"], "pct_path": "/nonexistent/pct"})
    assert not ok and "pct not found" in res["msg"] and "\n" not in res["msg"]
