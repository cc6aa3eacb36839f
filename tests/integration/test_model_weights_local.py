"""model_weights through ansible-runner, local transport (the pct path is tested in tests/containers): idempotence
four ways, diff, one changed shard, refusals before anything changes, and the documented return keys."""
import os
import re

import pytest

from ansible_collections.dflash.ops.plugins.modules import model_weights

pytestmark = pytest.mark.timeout(120)
MB = 1 << 20


@pytest.fixture
def store(tmp_path):
    src = tmp_path / "store" / "M"
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"vocab_size": 8}')
    for i, size in ((1, 3 * MB), (2, 2 * MB)):
        (src / ("model-%d.safetensors" % i)).write_bytes(os.urandom(size))
    (tmp_path / "shm").mkdir()
    return src


def args(tmp_path, **extra):
    return dict({"transport": "local", "source": str(tmp_path / "store" / "M"), "dest": str(tmp_path / "shm" / "M"),
                 "runs_root": str(tmp_path / "runs")}, **extra)


def documented_keys():
    return set(re.findall(r"^([a-z_]+):$", model_weights.RETURN, re.M))


def test_idempotent_four_ways_with_diff(ansible, tmp_path, store):
    ok, res = ansible.module("dflash.ops.model_weights", args(tmp_path), check=True, diff=True)
    assert ok and res["changed"] and res["bytes_copied"] == 5 * MB + 17 and not (tmp_path / "shm" / "M").exists()
    assert "model-1.safetensors %d" % (3 * MB) in res["diff"]["after"]
    ok, res = ansible.module("dflash.ops.model_weights", args(tmp_path))
    assert ok and res["changed"] and len(res["copied"]) == 3 and res["mb_per_s"] > 0, res
    assert os.path.islink(str(tmp_path / "shm" / "M")) and "diff" not in res
    # (warnings: the test helper passes args as a template, which Ansible warns about)
    assert set(res) - {"changed", "invocation", "warnings", "_ansible_no_log"} <= documented_keys(), set(res)
    for check in (True, False):
        ok, res = ansible.module("dflash.ops.model_weights", args(tmp_path), check=check)
        assert ok and not res["changed"] and res["copied"] == [], res
    (store / "model-2.safetensors").write_bytes(os.urandom(MB))
    ok, res = ansible.module("dflash.ops.model_weights", args(tmp_path), diff=True)
    assert ok and res["changed"] and res["copied"] == ["model-2.safetensors"] and res["bytes_copied"] == MB
    assert (tmp_path / "shm" / "M" / "model-2.safetensors").read_bytes() == (store / "model-2.safetensors").read_bytes()


@pytest.mark.parametrize("extra,needle", [
    ({"dest": "/M"}, "must be a directory to create inside an existing one"),
    ({"source": "/nonexistent/M"}, "source /nonexistent/M is not a directory in the container"),
    ({"verify": "sometimes"}, "value of verify must be one of: size, full"),
])
def test_bad_input_is_one_line_and_changes_nothing(ansible, tmp_path, store, extra, needle):
    ok, res = ansible.module("dflash.ops.model_weights", args(tmp_path, **extra))
    assert not ok and needle in res["msg"] and "\n" not in res["msg"], res["msg"]
    assert os.listdir(str(tmp_path / "shm")) == []
