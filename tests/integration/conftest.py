"""Fixtures: an ansible-runner caller, a runs root whose processes are killed after each test, a tiny target."""
import os
import signal
import subprocess
import sys

import pytest
from ansible_helpers import Ansible


@pytest.fixture
def ansible(tmp_path):
    return Ansible(tmp_path)


@pytest.fixture
def runs_root(tmp_path):
    """A runs root whose process groups are all killed at the end of the test, whatever happened."""
    root = tmp_path / "runs"
    root.mkdir()
    yield root
    for pid_file in root.glob("*/pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError, PermissionError):
            pass


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A tiny random Qwen3 target (target/) and its 96-sequence dataset (data/), built once per session (~8 s of
    CPU each build): every test only reads it (runs write under their own tmp dirs)."""
    root = tmp_path_factory.mktemp("tiny")
    subprocess.run([sys.executable, "-m", "dflash_trainer.prep.make_tiny", "--target-dir", str(root / "target"),
                    "--data-dir", str(root / "data"), "--num-sequences", "96"], check=True, capture_output=True)
    return root
