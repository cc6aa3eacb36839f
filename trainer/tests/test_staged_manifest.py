"""--target-model staged by the collection (dflash.ops.model_weights): a manifest that is not complete is refused
at start in one line naming the file and the fix; a directory without a manifest (the tiny target) is accepted."""

import json
import os
import shutil

import pytest

from trainer_testlib import train_cmd
from dflash_trainer.cli import config_from_args
from dflash_trainer.config import STAGED_MANIFEST, StartupError, validate_paths
from test_cli import _run


def staged_copy(tiny, tmp_path, **manifest_changes):
    """The tiny target as model_weights leaves it: every file with its size in a complete manifest."""
    target = str(tmp_path / "staged")
    shutil.copytree(tiny["target"], target)
    files = {}
    for rel in sorted(os.listdir(target)):
        files[rel] = {"size": os.path.getsize(os.path.join(target, rel)), "mtime_ns": 0, "hash": "0" * 32}
    manifest = {"format": 1, "complete": True, "source": "/store/tiny", "hash": "xxh3_128", "files": files}
    manifest.update(manifest_changes)
    with open(os.path.join(target, STAGED_MANIFEST), "w") as f:
        json.dump(manifest, f)
    return target


def check(tiny, target):
    validate_paths(config_from_args(["--target-model", target, "--data-dir", tiny["data"], "--output-dir",
                                     os.path.join(os.path.dirname(target), "out")]))


def test_complete_manifest_and_no_manifest_are_accepted(tiny, tmp_path):
    check(tiny, staged_copy(tiny, tmp_path))
    check(tiny, tiny["target"])


def _shard(target):
    return next(n for n in sorted(os.listdir(target)) if n.endswith(".safetensors"))


@pytest.mark.parametrize("damage,needle", [
    ("missing", "is missing model.safetensors"),
    ("short", "model.safetensors has 10 bytes"),
    ("incomplete", "partial stage"),
    ("unreadable", "unreadable"),
])
def test_partial_stage_refused_naming_the_file_and_the_fix(tiny, tmp_path, damage, needle):
    target = staged_copy(tiny, tmp_path, complete=damage != "incomplete")
    shard = os.path.join(target, _shard(target))
    needle = needle.replace("model.safetensors", _shard(target))
    if damage == "missing":
        os.unlink(shard)
    elif damage == "short":
        with open(shard, "r+b") as f:
            f.truncate(10)
    elif damage == "unreadable":
        with open(os.path.join(target, STAGED_MANIFEST), "w") as f:
            f.write('{"format": 1, "complete": tr')
    with pytest.raises(StartupError) as exc:
        check(tiny, target)
    msg = str(exc.value)
    assert "\n" not in msg and needle in msg and "re-run stage_weights" in msg, msg


def test_dflash_train_refuses_a_partial_stage_in_one_line(tiny, tmp_path):
    target = staged_copy(tiny, tmp_path)
    os.unlink(os.path.join(target, "config.json"))
    cmd = train_cmd(tiny, tmp_path / "out")
    cmd[cmd.index("--target-model") + 1] = target
    result = _run(cmd)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "missing config.json" in lines[0] and "re-run stage_weights" in lines[0]
