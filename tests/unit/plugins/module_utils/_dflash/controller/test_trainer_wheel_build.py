"""The trainer wheel is built reproducibly from the collection's trainer/ (two builds seconds apart are byte-identical),
cached by a hash of its sources and pins, rebuilt when a source changes, and never built into the cache in check mode."""
import importlib.util
import os
import shutil
import time
import zipfile

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import trainer_wheel_build as build

# Building needs setuptools next to the controller's Python (the module says so when it is missing); ansible-test's
# units venv (scripts/gates units) has none, the checkout's .venv (scripts/test) has.
needs_setuptools = pytest.mark.skipif(importlib.util.find_spec("setuptools") is None,
                                      reason="setuptools is not installed in this Python")
pytestmark = pytest.mark.checkout  # ansible-test units skips it (tests/unit/conftest.py)
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 6))
TRAINER = os.path.join(REPO, "trainer")


@pytest.fixture
def source(tmp_path):
    """A copy of trainer/'s build inputs (a test may change it), with the checkout's own mtimes and modes."""
    dest = tmp_path / "trainer"
    for rel in build.source_files(TRAINER):
        os.makedirs(dest / os.path.dirname(rel), exist_ok=True)
        shutil.copy2(os.path.join(TRAINER, rel), dest / rel)
    return str(dest)


@needs_setuptools
def test_two_builds_seconds_apart_are_byte_identical(source, tmp_path):
    first = build.build_wheel(source, str(tmp_path / "a"))
    time.sleep(1.5)
    os.utime(os.path.join(source, "src", "dflash_trainer", "cli.py"))  # a fresh mtime, as after a checkout
    os.chmod(os.path.join(source, "src", "dflash_trainer", "cli.py"), 0o600)  # and another umask
    second = build.build_wheel(source, str(tmp_path / "b"))
    assert os.path.basename(first) == os.path.basename(second) == "dflash_trainer-0.1.0-py3-none-any.whl"
    with open(first, "rb") as f1, open(second, "rb") as f2:
        assert f1.read() == f2.read()
    names = zipfile.ZipFile(first).namelist()
    assert "dflash_trainer/cli.py" in names and not any("__pycache__" in n or "tests/" in n for n in names)
    assert not os.path.exists(os.path.join(source, "build"))  # built from a copy: the source tree stays clean


@needs_setuptools
def test_cached_by_source_hash_rebuilt_on_change_and_check_mode_builds_nothing(source, tmp_path):
    dest = str(tmp_path / "cache")
    planned = build.trainer_wheel(source, dest, check_mode=True)
    assert planned["changed"] and planned["wheel"] is None and planned["sha256"] and not os.path.exists(dest)
    first = build.trainer_wheel(source, dest)
    assert first["changed"] and first["sha256"] == planned["sha256"] and first["wheel_name"] == planned["wheel_name"]
    assert first["version"] == "0.1.0" and "torch==2.13.0" in first["pins"]
    again = build.trainer_wheel(source, dest)
    assert not again["changed"] and again["wheel"] == first["wheel"] and again["sha256"] == first["sha256"]
    with open(os.path.join(source, "requirements.txt"), "a") as f:
        f.write("extra-pin==1.0\n")  # the pins are part of the hash
    changed = build.trainer_wheel(source, dest, check_mode=True)
    assert changed["changed"] and changed["source_hash"] != first["source_hash"]


@pytest.mark.parametrize("line", ["--index-url http://evil/", "torch>=2.5", "-e ."])
def test_a_pin_file_line_that_is_not_a_pin_is_refused(source, tmp_path, line):
    with open(os.path.join(source, "requirements.txt"), "a") as f:
        f.write(line + "\n")
    with pytest.raises(build.WheelBuildError, match="is not a pin: write name==version"):
        build.trainer_wheel(source, str(tmp_path / "cache"), check_mode=True)


def test_a_directory_without_pyproject_is_refused(tmp_path):
    with pytest.raises(build.WheelBuildError, match="has no pyproject.toml: trainer_source must be"):
        build.trainer_wheel(str(tmp_path), str(tmp_path / "cache"))


@needs_setuptools
def test_extras_add_their_pins_and_are_part_of_the_hash(source, tmp_path):
    dest = str(tmp_path / "cache")
    plain = build.trainer_wheel(source, dest, check_mode=True)
    fp8 = build.trainer_wheel(source, dest, check_mode=True, extras=["fp8"])
    assert fp8["pins"] == plain["pins"] + ["torchao==0.18.0"]  # pyproject.toml's fp8 extra, after the pins
    assert fp8["source_hash"] != plain["source_hash"]  # another environment in the container
    assert fp8["sha256"] == plain["sha256"]  # the same wheel: extras change what is installed beside it


@pytest.mark.parametrize("extras, message", [
    (["gpu"], r"trainer extra 'gpu' is not in .*pyproject.toml's optional-dependencies; pass some of .*fp8"),
    (["test"], r"pyproject.toml \[test\]: pytest is not a pin: write name==version"),  # the test extra is unpinned
])
def test_an_unknown_or_unpinned_extra_is_refused_before_anything_is_built(source, tmp_path, extras, message):
    with pytest.raises(build.WheelBuildError, match=message):
        build.trainer_wheel(source, str(tmp_path / "cache"), extras=extras)
    assert not os.path.exists(tmp_path / "cache")
