"""The shipped lifecycle package: what sources() sends is the whole container/ package, stdlib only, and it runs in
a fresh interpreter that cannot import the collection (as in a container), through BOOTSTRAP and the JSON stdin."""
import ast
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash import container
from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import procfs
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import (
    lifecycle_shipping, run_config, training_backend)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.transport.command import Transport, TransportError

CONTAINER_DIR = os.path.dirname(os.path.abspath(container.__file__))
ROOT = os.path.abspath(os.path.join(CONTAINER_DIR, "..", "..", "..", ".."))
FAKE = os.path.join(ROOT, "tests", "harness", "fake_trainer.py")
PKG = lifecycle_shipping.PACKAGE
# Third-party modules a shipped module may use where they happen to exist: imported inside a function, under a
# try/except ImportError that falls back. A new one belongs here only on purpose.
OPTIONAL = {"pynvml": "gpu_release: NVML, absent without an NVIDIA driver",
            "xxhash": "weights_manifest: a faster hash, blake2b otherwise"}


def package_files():
    return sorted(n for n in os.listdir(CONTAINER_DIR) if n.endswith(".py"))


def make_req(runs_root, state="status", **params):
    p = training_backend.argument_spec().defaults()
    p.update(name="r1", state=state, transport="local", runs_root=str(runs_root), command=[sys.executable, FAKE],
             trainer_args={"interval": 0.05}, settle_time=0.1, heartbeat_timeout=5, stop_timeout=5,
             lock_timeout=5, gpu_device_pattern=str(runs_root / "dev" / "nvidia{index}"))
    p.update(params)
    return run_config.build_request(p)


def run_isolated(request, tmp_path):
    """BOOTSTRAP in `python -I -S`: no site-packages, no cwd, no PYTHON* variables; nothing but the stdlib."""
    stdin = json.dumps({"sources": lifecycle_shipping.sources(), "package": PKG,
                        "entry": lifecycle_shipping.ENTRY, "request": request})
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", lifecycle_shipping.BOOTSTRAP], input=stdin,
                          capture_output=True, text=True, cwd=str(tmp_path), env={"PATH": os.environ["PATH"]},
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and proc.stderr == "", (proc.stdout, proc.stderr)
    return json.loads(lines[0])


# --- what is shipped -------------------------------------------------------------------------------------------

def test_sources_are_exactly_the_container_package():
    sources = lifecycle_shipping.sources()
    expected = {PKG: "__init__.py"}
    expected.update(("%s.%s" % (PKG, n[:-3]), n) for n in package_files() if n != "__init__.py")
    assert set(sources) == set(expected), "a module of container/ is not shipped (or one is shipped twice)"
    for name, filename in expected.items():
        with open(os.path.join(CONTAINER_DIR, filename)) as f:
            assert sources[name] == f.read(), name
    assert lifecycle_shipping.ENTRY in sources


def _catches_import_error(handler):
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names)


def _imports(tree):
    """(module name, or None for `from . import x`; level; inside a function; under try/except ImportError)."""
    out = []

    def visit(node, in_function, guarded):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((alias.name, 0, in_function, guarded) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                out.append((child.module, child.level, in_function, guarded))
            if isinstance(child, ast.Try):
                catches = any(_catches_import_error(h) for h in child.handlers if h.type is not None)
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), in_function, guarded or catches)
                for part in child.handlers + child.orelse + child.finalbody:
                    visit(ast.Module(body=[part], type_ignores=[]), in_function, guarded)
                continue
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, nested, guarded)

    visit(tree, False, False)
    return out


@pytest.mark.parametrize("filename", package_files())
def test_shipped_module_imports_only_the_stdlib_and_the_package(filename):
    with open(os.path.join(CONTAINER_DIR, filename)) as f:
        tree = ast.parse(f.read(), filename)
    siblings = set(n[:-3] for n in package_files())
    for module, level, in_function, guarded in _imports(tree):
        if level:
            assert level == 1 and (module is None or module in siblings), "%s: relative import of %r" % (
                filename, module)
            continue
        top = module.split(".")[0]
        if top in OPTIONAL:
            assert in_function and guarded, (
                "%s imports %s outside a function or without try/except ImportError: it is optional (%s)"
                % (filename, top, OPTIONAL[top]))
            continue
        assert top in sys.stdlib_module_names, "%s imports %r, which a container's python3 lacks" % (filename, module)


def test_import_checker_sees_what_it_must_refuse():
    src = ("import os\nfrom . import x\nfrom .procfs import y\nimport yaml\n"
           "def f():\n    import pynvml\n"
           "def g():\n    try:\n        import xxhash\n    except ImportError:\n        import zlib\n"
           "try:\n    import a.b\nexcept (OSError, ModuleNotFoundError):\n    pass\n"
           "try:\n    import c\nexcept OSError:\n    pass\n")
    assert _imports(ast.parse(src)) == [
        ("os", 0, False, False), (None, 1, False, False), ("procfs", 1, False, False), ("yaml", 0, False, False),
        ("pynvml", 0, True, False), ("xxhash", 0, True, True), ("zlib", 0, True, False),
        ("a.b", 0, False, True), ("c", 0, False, False)]


# --- it runs where the collection is not -----------------------------------------------------------------------

def test_the_isolated_interpreter_cannot_see_the_collection(tmp_path):
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", "import ansible_collections.dflash.ops"],
                          capture_output=True, text=True, cwd=str(tmp_path), env={"PATH": os.environ["PATH"]})
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


def test_status_through_bootstrap_in_a_fresh_interpreter(tmp_path):
    runs_root = tmp_path / "runs"
    out = run_isolated(make_req(runs_root), tmp_path)
    assert out["run"] == "r1" and out["run_dir"] == str(runs_root / "r1")
    assert out["phase"] == "never launched" and out["alive"] is False and out["launched"] is False
    assert out["gpu_memory"] is None and out["gpu_memory_note"] == "no GPUs configured for this run"
    # with GPUs: NVML is unusable there (no pynvml without site-packages), and status says so instead of failing
    out = run_isolated(make_req(runs_root, gpus=[0]), tmp_path)
    assert out["gpu_memory"] is None and "pynvml" in out["gpu_memory_note"]
    assert not runs_root.exists()


def test_invalid_name_through_bootstrap_is_a_failed_result(tmp_path):
    req = make_req(tmp_path / "runs")
    req["run"] = "../x"
    out = run_isolated(req, tmp_path)
    assert out["failed"] is True and "invalid run name" in out["msg"]
    assert os.listdir(str(tmp_path)) == []


def test_restart_and_status_through_run_lifecycle_remote(tmp_path):
    """The module's own path in local mode: Transport('local') runs BOOTSTRAP (env -i), the trainer outlives it."""
    runs_root = tmp_path / "runs"
    transport = Transport("local")
    res = lifecycle_shipping.run_lifecycle_remote(transport, make_req(runs_root, state="restarted"),
                                                  python=sys.executable, timeout=60)
    pid = res.get("pid")
    try:
        assert res["action"] == "launched" and res["changed"] is True and res["phase"] == "training", res
        assert procfs.is_alive(pid) and procfs.proc_pgrp(pid) == pid
        st = lifecycle_shipping.run_lifecycle_remote(transport, make_req(runs_root), python=sys.executable)
        assert st["alive"] is True and st["pid"] == pid and st["fingerprint"] == res["fingerprint"]
        stop = lifecycle_shipping.run_lifecycle_remote(transport, make_req(runs_root, state="stopped"),
                                                       python=sys.executable)
        assert stop["action"] == "stopped" and stop["stopped"][0]["signal"] == "SIGTERM"
        assert not procfs.is_alive(pid)
    finally:
        if pid and procfs.is_alive(pid) and FAKE in (procfs.cmdline(pid) or []):
            procfs.stop_group(pid, 0)


def test_missing_python_at_the_target_is_a_transport_error(tmp_path):
    with pytest.raises(TransportError) as exc:
        lifecycle_shipping.run_lifecycle_remote(Transport("local"), make_req(tmp_path / "runs"),
                                                python=str(tmp_path / "no-python3"))
    assert "not found in the local host" in str(exc.value)
