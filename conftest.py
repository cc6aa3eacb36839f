"""Loaded for every suite (the rootdir's conftest): how pytest-xdist may spread the tests over its workers.

scripts/test runs `pytest -n 2 --dist loadgroup`. Each test file stays on one worker, so its module and session
fixtures (a trained run, a tiny target) are made once; every real-container test (tests/containers) goes to one
worker: those tests share the harness's vmids 200/201 and a machine-wide lock. And which tests make the quick set."""
import pytest

CONTAINERS = "containers"
QUICK_SUITES = ("tests/unit/", "trainer/tests/")  # `scripts/test --quick` = these, less the tests marked slow


@pytest.hookimpl(tryfirst=True)  # before `-m quick` deselects by these marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        in_containers = item.get_closest_marker(CONTAINERS) or path.startswith("tests/containers/")
        item.add_marker(pytest.mark.xdist_group(CONTAINERS if in_containers else path))
        if path.startswith(QUICK_SUITES) and not in_containers and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.quick)
