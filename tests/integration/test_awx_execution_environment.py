"""The execution environment: `ansible-builder create` on awx/execution-environment.yml gives a build context with
exactly the collection's controller-side requirements (requirements.txt, bindep.txt) and the pinned ansible-core and
ansible-runner, nothing of the trainer; `ansible-builder introspect` finds the same files through the collection's
meta/execution-environment.yml."""
import os
import re
import subprocess

import pytest
import yaml
from ansible_helpers import BIN, ROOT

pytestmark = pytest.mark.timeout(120)
TRAINER_ONLY = ("torch", "transformers", "safetensors", "pyarrow", "accelerate", "dflash_trainer")


def _lines(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


def _pins():
    return dict(line.split("==") for line in _lines(os.path.join(ROOT, "tests", "requirements.txt")) if "==" in line)


def test_create_gives_a_context_with_the_collection_requirements_and_no_trainer(tmp_path):
    ctx = tmp_path / "context"
    proc = subprocess.run([os.path.join(BIN, "ansible-builder"), "create", "-f",
                           os.path.join(ROOT, "awx", "execution-environment.yml"), "-c", str(ctx)],
                          capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _lines(ctx / "_build" / "requirements.txt") == _lines(os.path.join(ROOT, "requirements.txt"))
    assert _lines(ctx / "_build" / "bindep.txt") == _lines(os.path.join(ROOT, "bindep.txt"))
    assert any(line.startswith("openssh-client") for line in _lines(ctx / "_build" / "bindep.txt"))
    (build_file,) = [p for p in (ctx / "Containerfile", ctx / "Dockerfile") if p.exists()]
    text = build_file.read_text()
    pins = _pins()
    assert "ansible-core==%s" % pins["ansible-core"] in text and "ansible-runner==%s" % pins["ansible-runner"] in text
    for path in ctx.rglob("*"):
        if path.is_file() and path.parent.name != "scripts":  # builder's own helper scripts
            words = set(re.findall(r"[A-Za-z0-9_.-]+", path.read_text(errors="replace")))
            assert not words & set(TRAINER_ONLY), (path, words & set(TRAINER_ONLY))


def test_introspect_reads_the_collection_requirements_through_meta():
    with open(os.path.join(ROOT, "meta", "execution-environment.yml")) as f:
        meta = yaml.safe_load(f)
    assert meta["dependencies"] == {"python": "requirements.txt", "system": "bindep.txt"}
    proc = subprocess.run([os.path.join(BIN, "ansible-builder"), "introspect", "--sanitize",
                           os.path.join(ROOT, ".collections")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    found = yaml.safe_load(proc.stdout)
    assert [p.split("#")[0].strip() for p in found["python"]] == _lines(os.path.join(ROOT, "requirements.txt"))
    assert [s.split("#")[0].strip() for s in found["system"]] == _lines(os.path.join(ROOT, "bindep.txt"))
    assert all("from collection dflash.ops" in line for line in found["python"] + found["system"])
