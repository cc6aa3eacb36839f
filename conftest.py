"""Loaded for every suite (the rootdir's conftest): which tests make the quick set (`scripts/test --quick`).

(Not pytest-xdist: with pytest 9.2, xdist 3.8's loadgroup no longer keeps a group on one worker, since it renames
item._nodeid, which pytest 9 no longer reads; the real-container tests, which hold a machine-wide lock for a whole
session, then waited on each other past their timeout. scripts/test runs them in a second pytest instead.)"""
import os
from pathlib import Path

import pytest

CONTAINERS = "containers"  # the real-container suite (its marker and folder): never quick
UNIT_SUITE = "tests/unit/"
QUICK_SUITES = (UNIT_SUITE, "trainer/tests/")  # `scripts/test --quick` = these, less the tests marked slow
# Files of those suites that train, run torchrun jobs, or build and install packages: each takes from seconds to
# minutes, so all of them are slow (left out of the quick set). New such files mark themselves (pytestmark).
SLOW_FILES = frozenset("trainer/tests/%s.py" % name for name in (
    "test_benchmark_packages", "test_checkpoint_and_nan", "test_cli", "test_dist_full_disk",
    "test_dist_rank_failure", "test_dist_split_fsdp", "test_dist_train", "test_dist_wall_clock", "test_evaluate",
    "test_export", "test_float8", "test_full_disk", "test_hybrid_target", "test_learning", "test_loop_resources",
    "test_preflight", "test_prepare_data", "test_proof_devices", "test_proof_prompts", "test_proof_tiny",
    "test_run_contract", "test_seed_layout", "test_serve_bench", "test_speed_benchmarks",
    "test_time_budget")) | {
    "tests/unit/plugins/module_utils/_dflash/container/test_trainer_install.py",
    "tests/unit/plugins/module_utils/_dflash/controller/test_trainer_wheel_build.py"}

_missing = sorted(name for name in SLOW_FILES if not (Path(__file__).parent / name).is_file())
assert not _missing, "conftest.py SLOW_FILES names files that do not exist (renamed?): %s" % _missing


@pytest.hookimpl(tryfirst=True)  # before `-m quick` deselects by these marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        in_containers = item.get_closest_marker(CONTAINERS) or path.startswith("tests/containers/")
        if path in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if path.startswith(QUICK_SUITES) and not in_containers and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.quick)
    if os.environ.get("DFLASH_UNITS_IN_GATES") == "1":
        # scripts/test with the gates: their units step (ansible-test units) runs tests/unit on the collection as it
        # ships; here only what it skips for want of the checkout (marked checkout), so each test runs once.
        kept, gated = [], []
        for item in items:
            in_gate = item.nodeid.startswith(UNIT_SUITE) and not item.get_closest_marker("checkout")
            (gated if in_gate else kept).append(item)
        if gated:
            config.hook.pytest_deselected(items=gated)
            items[:] = kept


def _cpu_seconds():
    import resource
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.cpu_start = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's CPU seconds (setup, call and teardown: pytest's own and that of the processes it waited for, such as
    ansible-playbook or a torchrun job; not detached trainers) as the JUnit property cpu_s, set before the teardown's
    report copies the properties: the machine is CPU-bound during the test command, so this, not the wall time, says
    what a test costs (scripts/test_times.py)."""
    if call.when == "teardown" and hasattr(item, "cpu_start"):
        item.user_properties.append(("cpu_s", round(_cpu_seconds() - item.cpu_start, 2)))
    yield
