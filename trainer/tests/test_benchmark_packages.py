"""The benchmarks and proofs are packages (trainer/benchmarks → `benchmarks`, trainer/proofs → `proofs`), run from
trainer/ as `python -m benchmarks.<name>`: no file of theirs edits sys.path, each module imports by its package
name, the README's command works from trainer/ with nothing on PYTHONPATH, and trainer/results/README.md indexes
every record kept there."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import pytest

TRAINER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("benchmarks", "proofs")
RESULTS = os.path.join(TRAINER, "results")


def package_files(package):
    folder = os.path.join(TRAINER, package)
    return sorted(n for n in os.listdir(folder) if n.endswith((".py", ".sh")))


def test_no_benchmark_or_proof_edits_sys_path():
    found = [f"{package}/{name}" for package in PACKAGES for name in package_files(package)
             if "sys.path" in open(os.path.join(TRAINER, package, name)).read()]
    assert found == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_imports_by_its_package_name(package):
    for name in package_files(package):
        if name.endswith(".py") and name != "__init__.py":
            module = importlib.import_module(f"{package}.{name[:-3]}")
            assert os.path.dirname(module.__file__) == os.path.join(TRAINER, package)


@pytest.mark.parametrize("module", ["benchmarks.train_step", "proofs.proof_smollm2"])
def test_python_dash_m_from_trainer_runs_without_pythonpath(module):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=TRAINER, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage:")


def test_the_results_index_lists_every_record():
    index = open(os.path.join(RESULTS, "README.md")).read()
    linked = set(re.findall(r"\]\(([^)#\s]+)\)", index))
    records = sorted(n for n in os.listdir(RESULTS) if n != "README.md")
    assert [n for n in records if n not in linked] == []
    assert sorted(n for n in linked if "/" not in n and n not in records) == []
