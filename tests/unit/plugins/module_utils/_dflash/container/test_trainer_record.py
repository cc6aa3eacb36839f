"""The launch-time trainer check (trainer_record.check_trainer) on real files, and through run_lifecycle.change: a
missing, non-executable or older trainer is refused naming both versions, before the live run is stopped."""
import json
import os
import sys

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import procfs, run_lifecycle
from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.trainer_record import (
    TrainerRefused, check_trainer, version_tuple)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import run_config, training_backend

ROOT = os.path.dirname(os.path.abspath(__file__))
for _ in range(6):
    ROOT = os.path.dirname(ROOT)
FAKE = os.path.join(ROOT, "tests", "harness", "fake_trainer.py")


def venv_with_trainer(tmp_path, version=None, mode=0o755):
    """<tmp>/venv/bin/dflash-train (a script) and, when version is given, the install record beside bin/."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "dflash-train"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(mode)
    if version is not None:
        (venv / "dflash-install.json").write_text(json.dumps({"version": version, "source_hash": "ab" * 32,
                                                             "installed_at": 1.0}))
    return venv, str(exe)


@pytest.mark.parametrize("text,expected", [("0.1.0", (0, 1)), ("0.1", (0, 1)), ("v1.2.3", (1, 2, 3)),
                                           ("0.10.0rc1", (0, 10)), ("2", (2,)), ("dev", None), ("", None)])
def test_version_tuple(text, expected):
    assert version_tuple(text) == expected


@pytest.mark.parametrize("installed,expected,ok", [("0.1.0", "0.1.0", True), ("0.2.0", "0.1.0", True),
                                                   ("0.10.0", "0.9.0", True), ("0.0.9", "0.1.0", False),
                                                   ("0.9.0", "0.10.0", False), ("garbage", "0.1.0", False)])
def test_an_older_installed_trainer_is_refused_naming_both_versions(tmp_path, installed, expected, ok):
    _, exe = venv_with_trainer(tmp_path, installed)
    if ok:
        assert check_trainer([exe], "/usr/bin", "/", expected) == installed
        return
    with pytest.raises(TrainerRefused) as exc:
        check_trainer([exe], "/usr/bin", "/", expected)
    assert str(exc.value).startswith("installed trainer %s is older than the %s this collection expects: run "
                                     "playbooks/install_trainer.yml" % (installed, expected))


def test_the_record_is_found_through_the_link_and_through_a_symlinked_command(tmp_path):
    venv, _ = venv_with_trainer(tmp_path, "0.0.9")
    os.symlink(str(venv), str(tmp_path / "current"))
    with pytest.raises(TrainerRefused, match="0.0.9 is older than the 0.1.0"):
        check_trainer([str(tmp_path / "current" / "bin" / "dflash-train")], "/usr/bin", "/", "0.1.0")
    (tmp_path / "usr-bin").mkdir()
    os.symlink(str(venv / "bin" / "dflash-train"), str(tmp_path / "usr-bin" / "dflash-train"))
    with pytest.raises(TrainerRefused, match="0.0.9 is older"):  # found on PATH, record beside its target
        check_trainer(["dflash-train"], str(tmp_path / "usr-bin"), "/", "0.1.0")


def test_without_a_record_or_without_an_expectation_the_command_is_accepted(tmp_path):
    _, exe = venv_with_trainer(tmp_path)
    assert check_trainer([exe], "/usr/bin", "/", "0.1.0") is None
    _, exe = venv_with_trainer(tmp_path / "b", "0.0.1")
    assert check_trainer([exe], "/usr/bin", "/", None) == "0.0.1"


def test_missing_and_not_executable_commands(tmp_path):
    with pytest.raises(TrainerRefused, match="does not exist: run playbooks/install_trainer.yml") as exc:
        check_trainer([str(tmp_path / "nope")], "/usr/bin", "/", None)
    assert exc.value.rc == 127
    with pytest.raises(TrainerRefused, match="dflash-no-such-command does not exist") as exc:
        check_trainer(["dflash-no-such-command"], str(tmp_path), "/", None)
    assert exc.value.rc == 127
    _, exe = venv_with_trainer(tmp_path, mode=0o644)
    with pytest.raises(TrainerRefused, match="is not an executable file") as exc:
        check_trainer([exe], "/usr/bin", "/", None)
    assert exc.value.rc == 126
    with pytest.raises(TrainerRefused, match="is not an executable file"):
        check_trainer([str(tmp_path)], "/usr/bin", "/", None)  # a directory


def _req(runs_root, **params):
    p = training_backend.argument_spec().defaults()
    p.update(name="r1", state="restarted", transport="local", runs_root=str(runs_root), command=[sys.executable, FAKE],
             trainer_args={"interval": 0.05}, settle_time=0.1, heartbeat_timeout=5, stop_timeout=5,
             gpu_release_timeout=2, lock_timeout=5, log_tail_lines=10)
    p.update(params)
    return run_config.build_request(p)


def test_a_restart_onto_an_older_trainer_is_refused_and_the_run_keeps_running(tmp_path, capsys):
    runs_root = tmp_path / "runs"
    venv, _ = venv_with_trainer(tmp_path, "0.0.9")
    os.symlink(sys.executable, str(venv / "bin" / "python"))
    first = run_lifecycle.change(_req(runs_root))
    try:
        run_lifecycle.main(_req(runs_root, force=True, command=[str(venv / "bin" / "python"), FAKE],
                                expect_trainer_version="0.1.0"))
        out = json.loads(capsys.readouterr().out)
        assert out["failed"] and out["rc"] == 126, out
        assert out["msg"].startswith("installed trainer 0.0.9 is older than the 0.1.0 this collection expects")
        assert procfs.is_alive(first["pid"]) and "stop" not in out["timings"]
        # the same request without the expectation launches (and stops the old run)
        again = run_lifecycle.change(_req(runs_root, force=True, command=[str(venv / "bin" / "python"), FAKE]))
        assert again["pid"] != first["pid"] and [s["pid"] for s in again["stopped"]] == [first["pid"]]
        procfs.stop_group(again["pid"], 5)
    finally:
        if procfs.is_alive(first["pid"]):
            procfs.stop_group(first["pid"], 5)
