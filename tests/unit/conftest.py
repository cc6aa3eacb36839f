"""The marker of tests/unit files that need the checkout, declared here so that ansible-test units (which copies
tests/unit but not the rootdir's pytest.ini) knows it too."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "checkout: needs the checkout (the trainer package, setuptools or git), which ansible-test units "
        "(the units gate) lacks, so it skips the test; with DFLASH_UNITS_IN_GATES=1 (scripts/test, when the gates run) "
        "these are the only tests of tests/unit that pytest runs (the rootdir's conftest.py)")
