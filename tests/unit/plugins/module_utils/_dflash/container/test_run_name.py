"""The one run-name rule: used by the controller, the in-container lifecycle and the role's preflight test."""
import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import run_name
from ansible_collections.dflash.ops.plugins.test.run_name import TestModule as RunNameTests


@pytest.mark.parametrize("name", ["slammed5", "a", "A.b_c-d", "x" * 64])
def test_good_run_names(name):
    assert run_name.validate_run_name(name) == name
    assert RunNameTests().tests()["run_name"](name) is True


@pytest.mark.parametrize("name", ["", "x" * 65, "a b", "a/b", "..", ".", "$(id)", "a;b", "é", "a\n", None, 5])
def test_bad_run_names(name):
    with pytest.raises(ValueError, match="invalid run name"):
        run_name.validate_run_name(name)
    assert RunNameTests().tests()["run_name"](name) is False
