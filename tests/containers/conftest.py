"""Real-container tests (root + LXC). Fixtures come from tests/harness (see tests/harness/README.md)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import harness`

from harness import lxc  # noqa: E402
from harness.fixtures import *  # noqa: E402,F401,F403
from harness.fixtures import pytest_configure  # noqa: E402,F401

PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"


def pytest_collection_modifyitems(config, items):
    reason = lxc.available()
    for item in items:
        if "containers" in item.keywords and reason:
            item.add_marker(pytest.mark.skip(reason=reason))
