"""Fixtures: an ansible-runner caller, and a runs root whose processes are killed after each test."""
import os
import signal

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
