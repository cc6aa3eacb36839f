"""Shared tiny fixtures: a random 8-layer Qwen3 target (hidden 64, vocab 512) and a small dataset."""

from __future__ import annotations

import os
import sys

# `import harness` (tests/harness: helpers shared by every suite, e.g. harness.wandb_files), as tests/conftest.py
# gives the collection's suites
TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests")
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


def _builtin_sys_intern():
    # In one pytest run with the collection's tests, importing ansible.module_utils.basic replaces sys.intern with
    # ansible's SysInternPatch object for the whole process, and torch.compile (dynamo) refuses it. The trainer never
    # shares a process with Ansible in production: give these tests the builtin back.
    sys.intern = getattr(sys.intern, "unpatched_implementation", sys.intern)


# Already at collection: test modules that import transformers' modeling code import torch._dynamo, which
# refuses the patched sys.intern at import time (before any fixture runs).
_builtin_sys_intern()

# Where the tests' processes keep the bytecode of what they import, beside this virtual environment. Where
# PYTHONDONTWRITEBYTECODE is set (this project's sandboxes set it), each process compiled torch's and transformers'
# sources anew: about 10 CPU-s a process (pytest's own, each dflash-train, proof worker and regeneration process),
# more than a tiny proof's training. This process from here on (torch is imported next); its children: the fixture.
PYCACHE = os.path.join(sys.prefix, "pycache")
sys.pycache_prefix, sys.dont_write_bytecode = PYCACHE, False

import pytest  # noqa: E402
import torch  # noqa: E402

from dflash_trainer.prep.make_tiny import write_dataset, write_target  # noqa: E402

# Two threads for a trainer pytest of its own on an idle machine; the caller's OMP_NUM_THREADS where it sets one.
# scripts/test sets 1: its two chains already fill both cores, and this process's second thread then spins waiting
# for the first (2026-12-05, nine in-process files beside one busy core: 174 s wall, 186 CPU-s with 2 threads;
# 116 s, 119 CPU-s with 1; test_synthesize.py beside two busy cores: 83 -> 26 s).
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 2))


def pytest_collect_file(file_path, parent):
    """Before each test module here is imported: the collection's tests, collected in between, may have patched
    sys.intern again (ansible does it on import)."""
    _builtin_sys_intern()


@pytest.fixture(scope="session", autouse=True)
def builtin_sys_intern_for_the_session():
    _builtin_sys_intern()


@pytest.fixture(autouse=True)
def builtin_sys_intern():
    _builtin_sys_intern()


@pytest.fixture(autouse=True)
def bytecode_for_child_processes(monkeypatch):
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", PYCACHE)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    target, data = str(root / "target"), str(root / "data")
    write_target(target, seed=0)
    write_dataset(data, num_sequences=96, seed=0)
    return {"target": target, "data": data}


@pytest.fixture(scope="module")
def chat_target(tiny, tmp_path_factory):
    """The tiny Qwen3 target plus the tiny tokenizer (ChatML template), in a directory of its own."""
    import shutil

    from dflash_trainer.prep.tiny_tokenizer import save_tokenizer
    d = tmp_path_factory.mktemp("chat_target") / "target"
    shutil.copytree(tiny["target"], d)
    save_tokenizer(str(d))
    return str(d)
