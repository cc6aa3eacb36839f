"""The golden container: Debian bookworm + python3 + a venv with the trainer's heavy dependencies.

Built once and kept between runs under the name dflash-golden-<hash8>, where the hash covers the whole recipe
(release, packages, LXC config, pinned wheels, this file's build steps). When the recipe changes the name changes,
a new golden is built and older dflash-golden-* containers are destroyed.

    python -m harness.golden build     # (from tests/) build if missing, print name + timings
    python -m harness.golden name      # print the current golden's name
    python -m harness.golden prune     # destroy golden containers of older recipes
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from contextlib import contextmanager
from pathlib import Path

from . import CACHE_DIR, CT_VENV, LOCK_DIR, REPO_ROOT, WHEEL_DIR, lxc

RECIPE_VERSION = 1
RELEASE = "bookworm"
PACKAGES = ["python3", "python3-venv", "python3-pip", "procps", "psmisc"]
# Pinned like the project's tests/requirements.txt; cp311 wheels (bookworm's python3 is 3.11, like the host's venv).
HEAVY_REQUIREMENTS = [
    "torch==2.13.0",
    "transformers==5.24.0",
    "safetensors==0.8.0",
    "pyarrow==26.0.1",
    "nvidia-ml-py==13.615.71",
]
# The trainer's extras whose pinned wheels the cache also holds (never in the golden venv): the container tests
# install them through the trainer role's trainer_extras.
CACHED_EXTRAS = ["fp8", "fla"]
PREFIX = "dflash-golden-"
MARKER = "dflash-golden.json"  # written next to the container's config once the build completed


def recipe() -> dict:
    return {
        "version": RECIPE_VERSION,
        "release": RELEASE,
        "packages": PACKAGES,
        "config": lxc.BASE_CONFIG,
        "requirements": HEAVY_REQUIREMENTS,
        "venv": CT_VENV,
    }


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()


def name() -> str:
    return PREFIX + recipe_hash()[:8]


def is_built(n: str | None = None) -> bool:
    n = n or name()
    return lxc.exists(n) and (lxc.LXC_PATH / n / MARKER).exists()


@contextmanager
def _lock(what: str):
    LOCK_DIR.mkdir(parents=True, exist_ok=True)  # the golden's name is machine-wide: so is its lock
    with open(LOCK_DIR / f"{what}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _log(msg: str) -> None:
    print(f"[golden] {msg}", file=sys.stderr, flush=True)


def extra_requirements() -> list[str]:
    """The pins of CACHED_EXTRAS, as trainer/pyproject.toml declares them."""
    with open(REPO_ROOT / "trainer" / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    return [pin for extra in CACHED_EXTRAS for pin in extras[extra]]


# A pip configuration naming index folders that do not exist (as this project's build machines have) makes pip warn
# once per package; those lines say nothing about this install.
IGNORED_LOCATION = re.compile(r"^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$")


def _quiet_pip(argv: list[str]) -> None:
    proc = subprocess.run(argv, stderr=subprocess.PIPE, text=True)
    lines = [line for line in proc.stderr.splitlines() if not IGNORED_LOCATION.match(line)]
    if lines:
        print("\n".join(lines), file=sys.stderr)
    if proc.returncode:
        raise SystemExit(f"golden: {' '.join(argv[3:5])} failed (exit {proc.returncode}); pip's lines are above")


def fetch_wheels() -> float:
    """pip download the heavy wheels and the cached extras' into WHEEL_DIR (a no-op when present). Returns seconds."""
    t0 = time.monotonic()
    WHEEL_DIR.mkdir(parents=True, exist_ok=True)
    stamp = WHEEL_DIR / ".requirements.json"
    extras = extra_requirements()
    want = json.dumps(HEAVY_REQUIREMENTS + extras)
    if stamp.exists() and stamp.read_text() == want:
        return 0.0
    pip = [sys.executable, "-m", "pip", "download", "-q", "-d", str(WHEEL_DIR)]
    _quiet_pip([*pip, *HEAVY_REQUIREMENTS])
    _quiet_pip([*pip, "--no-deps", *extras])  # their own deps are the pins above
    stamp.write_text(want)
    return time.monotonic() - t0


def build(force: bool = False) -> dict:
    """Build the golden container if it is missing (or `force`). Returns {name, built, timings}."""
    n = name()
    timings: dict[str, float] = {}
    with _lock("golden"):
        # Clones bind-mount the wheel cache (a fresh checkout has none even when the golden exists).
        timings["wheels"] = fetch_wheels()
        if is_built(n) and not force:
            return {"name": n, "built": False, "timings": timings}
        lxc.destroy(n)  # a half-built one from an interrupted run
        conf = CACHE_DIR / f"{n}.conf"
        conf.write_text(lxc.BASE_CONFIG)
        t0 = time.monotonic()
        _log(f"lxc-create {n} (debian {RELEASE}, {','.join(PACKAGES)})")
        p = subprocess.run(["lxc-create", "-n", n, "-t", "debian", "-f", str(conf), "--", "-r", RELEASE,
                            f"--packages={','.join(PACKAGES)}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if p.returncode != 0:
            lxc.destroy(n)
            raise RuntimeError(f"lxc-create {n} failed ({p.returncode}):\n{p.stdout[-4000:]}")
        timings["lxc_create"] = time.monotonic() - t0
        try:
            t0 = time.monotonic()
            lxc.start(n)
            lxc.wait_ready(n)
            root = lxc.LXC_PATH / n / "rootfs"  # dir backend: the host can write into it directly
            ct_wheels = root / "opt/dflash/golden-wheels"
            ct_wheels.mkdir(parents=True, exist_ok=True)
            for w in WHEEL_DIR.glob("*.whl"):
                shutil.copy2(w, ct_wheels / w.name)
            names = [r.split("==")[0] for r in HEAVY_REQUIREMENTS]
            _log(f"venv {CT_VENV} + pip install --no-index {' '.join(names)}")
            lxc.sh(n, f"set -e; python3 -m venv {CT_VENV}; "
                      f"{CT_VENV}/bin/pip install -q --no-index --find-links /opt/dflash/golden-wheels "
                      f"{' '.join(HEAVY_REQUIREMENTS)}; rm -rf /opt/dflash/golden-wheels; "
                      f"{CT_VENV}/bin/python -c 'import torch, transformers, safetensors, pyarrow'",
                   timeout=1200)
            timings["venv"] = time.monotonic() - t0
        except BaseException:
            lxc.stop(n, kill=True)
            lxc.destroy(n)
            raise
        lxc.stop(n)
        (lxc.LXC_PATH / n / MARKER).write_text(json.dumps({"recipe": recipe(), "timings": timings,
                                                          "built_at": time.time()}, indent=1))
        return {"name": n, "built": True, "timings": timings}


def prune() -> list[str]:
    """Destroy golden containers of other recipes (and their clones must already be gone)."""
    keep = name()
    gone = []
    for d in lxc.LXC_PATH.glob(PREFIX + "*"):
        if d.name != keep and (d / "config").exists():
            lxc.destroy(d.name)
            gone.append(d.name)
    return gone


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "build"
    if cmd == "name":
        print(name())
    elif cmd == "build":
        t0 = time.monotonic()
        res = build(force="--force" in argv)
        res["total_s"] = round(time.monotonic() - t0, 1)
        res["pruned"] = prune()
        print(json.dumps(res))
    elif cmd == "prune":
        print(json.dumps(prune()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
