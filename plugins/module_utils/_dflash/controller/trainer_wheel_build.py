# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Build the bundled trainer's wheel on the controller, reproducibly, keyed by a hash of its sources and pins.

source_hash = sha256 over (relative path, content) of pyproject.toml, requirements.txt (the pins) and src/**, and
the names of the extras whose pinned requirements (pyproject.toml's optional-dependencies) join the pins, so that
another choice of extras is another environment in the container.
The wheel is built from a copy of exactly those files (normalised modes, no build litter in the source tree)
with SOURCE_DATE_EPOCH fixed, so the same sources give the same bytes on any controller with the same setuptools;
it is cached as <dest>/<source_hash[:16]>/<wheel>, so an unchanged trainer is hashed, never rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.file_digest import sha256_file

# 1980-01-01, the earliest time a zip entry can carry: a constant, because file mtimes differ between a checkout
# and an unpacked collection of the same sources.
SOURCE_DATE_EPOCH = "315532800"
TOP_FILES = ("pyproject.toml", "requirements.txt", "setup.cfg", "setup.py")
SKIP_DIRS = ("__pycache__",)
SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")
VERSION_RE = re.compile(r'^version\s*=\s*"([^"]+)"', re.M)


class WheelBuildError(Exception):
    pass


def source_files(source):
    """Relative paths of the files that make the wheel, sorted."""
    if not os.path.isfile(os.path.join(source, "pyproject.toml")):
        raise WheelBuildError("%s has no pyproject.toml: trainer_source must be the collection's trainer/ "
                              "directory" % source)
    files = [name for name in TOP_FILES if os.path.isfile(os.path.join(source, name))]
    for root, dirs, names in os.walk(os.path.join(source, "src")):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(SKIP_SUFFIXES))
        for name in sorted(names):
            if not name.endswith(SKIP_SUFFIXES):
                files.append(os.path.relpath(os.path.join(root, name), source))
    return sorted(files)


def source_hash(source, files, extras=()):
    h = hashlib.sha256()
    if extras:  # none: the hash of the files alone, as before extras existed
        h.update(b"extras\0" + ",".join(sorted(extras)).encode() + b"\0")
    for rel in files:
        with open(os.path.join(source, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def read_pins(source, extras=()):
    """Requirement lines of trainer/requirements.txt (comments and blanks dropped), then those of each extra in
    `extras` (pyproject.toml's optional-dependencies, e.g. fp8 = ["torchao==0.18.0"])."""
    path = os.path.join(source, "requirements.txt")
    pins = []
    if os.path.isfile(path):
        with open(path) as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
        pins = [line for line in lines if line]
    _check_pins(path, pins)
    return pins + read_extra_pins(source, extras)


def read_extra_pins(source, extras):
    if not extras:
        return []
    try:
        import tomllib  # Python 3.11+, the controller's; imported here so that older Pythons can import this file
    except ImportError:
        raise WheelBuildError("trainer extras %s need Python 3.11 or newer on the controller (tomllib); or pass "
                              "no extras" % ", ".join(extras)) from None
    path = os.path.join(source, "pyproject.toml")
    with open(path, "rb") as f:
        known = tomllib.load(f).get("project", {}).get("optional-dependencies", {})
    pins = []
    for extra in extras:
        if extra not in known:
            raise WheelBuildError("trainer extra %r is not in %s's optional-dependencies; pass some of %s"
                                  % (extra, path, ", ".join(sorted(known)) or "none"))
        _check_pins("%s [%s]" % (path, extra), known[extra])
        pins.extend(pin for pin in known[extra] if pin not in pins)
    return pins


def _check_pins(where, pins):
    bad = [pin for pin in pins if pin.startswith("-") or "==" not in pin]
    if bad:
        raise WheelBuildError("%s: %s is not a pin: write name==version, one a line" % (where, bad[0]))


def read_version(source):
    with open(os.path.join(source, "pyproject.toml")) as f:
        match = VERSION_RE.search(f.read())
    if not match:
        raise WheelBuildError("%s/pyproject.toml has no version = \"...\" line" % source)
    return match.group(1)


def _copy_tree(source, files, dest):
    for rel in files:
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(source, rel), target)
        os.chmod(target, 0o644)  # the wheel records modes: the checkout's umask must not show


def build_wheel(source, out_dir, python=None):
    """pip wheel (no deps, no build isolation: offline) of a clean copy into out_dir; returns the wheel's path."""
    files = source_files(source)
    work = tempfile.mkdtemp(prefix="dflash-wheel-")
    try:
        tree = os.path.join(work, "trainer")
        _copy_tree(source, files, tree)
        env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH, PYTHONHASHSEED="0",
                   PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
        argv = [python or sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                "--no-cache-dir", "--wheel-dir", os.path.join(work, "out"), tree]
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=env, cwd=work, check=False)
        if proc.returncode != 0:
            text = proc.stdout.decode("utf-8", "replace")
            hint = " (setuptools>=64 must be installed next to the controller's ansible: pip install setuptools)" \
                if "setuptools" in text else ""
            last = next((line for line in reversed(text.splitlines()) if line.strip()), "no output")
            raise WheelBuildError("building the trainer wheel failed (exit %s): %s%s" % (proc.returncode, last, hint))
        wheels = [n for n in os.listdir(os.path.join(work, "out")) if n.endswith(".whl")]
        if len(wheels) != 1:
            raise WheelBuildError("pip wheel made %d wheels from %s, expected one" % (len(wheels), source))
        os.makedirs(out_dir, exist_ok=True)
        final = os.path.join(out_dir, wheels[0])
        shutil.move(os.path.join(work, "out", wheels[0]), final + ".tmp")
        os.replace(final + ".tmp", final)
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cached_wheel(out_dir):
    try:
        wheels = [n for n in os.listdir(out_dir) if n.endswith(".whl")]
    except OSError:
        return None
    return os.path.join(out_dir, wheels[0]) if len(wheels) == 1 else None


def trainer_wheel(source, dest, check_mode=False, force=False, extras=()):
    """{changed, wheel, wheel_name, version, source_hash, sha256, pins}; builds only when not cached (or force).
    extras: the trainer's extras whose pins join requirements.txt's (e.g. ["fp8"]: torchao)."""
    source = os.path.abspath(source)
    files = source_files(source)
    pins = read_pins(source, extras)  # first: a bad pin or extra is refused before anything is built
    digest = source_hash(source, files, extras)
    version = read_version(source)
    out = {"source": source, "source_hash": digest, "version": version, "pins": pins, "changed": False}
    out_dir = os.path.join(dest, digest[:16])
    wheel = None if force else cached_wheel(out_dir)
    if wheel is not None:
        return _described(out, wheel, version)
    out["changed"] = True
    if check_mode:
        # Built aside and thrown away: the install's check mode still learns the wheel's name and hash.
        scratch = tempfile.mkdtemp(prefix="dflash-wheel-check-")
        try:
            return dict(_described(out, build_wheel(source, scratch), version), wheel=None)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    return _described(out, build_wheel(source, out_dir), version)


def _described(out, wheel, version):
    name = os.path.basename(wheel)
    if name.split("-")[1] != version:
        raise WheelBuildError("the wheel %s does not carry pyproject.toml's version %s" % (name, version))
    return dict(out, wheel=wheel, wheel_name=name, sha256=sha256_file(wheel))
