"""Command line for scenario drivers (Molecule's create/destroy): clone / destroy vmid containers.

    python -m harness.ct create VMID [--trainer]   # clone the golden (building it if needed), start it;
                                                  # --trainer: install the checkout's trainer wheel + tiny model
    python -m harness.ct destroy VMID
Prints one JSON line with timings.
"""
from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import LOCK_DIR, REPO_ROOT, golden, lxc
from .fixtures import _prepare_clone, install_trainer, make_tiny


def build_trainer_wheel(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(REPO_ROOT / "trainer")], check=True)
    return next(out.glob("*.whl"))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("create", "destroy") or not argv[1].isdigit():
        print(__doc__, file=sys.stderr)
        return 2
    vmid = int(argv[1])
    if argv[0] == "destroy":
        lxc.stop(str(vmid), kill=True)
        lxc.destroy(str(vmid))
        print(json.dumps({"destroyed": vmid, "exists": lxc.exists(str(vmid))}))
        return 0
    # a pytest harness session holds this lock while it uses vmids 200/201: do not clobber its containers
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / "vmids.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"a pytest harness session is using the vmids right now; run this after it ends", file=sys.stderr)
            return 1
        fcntl.flock(fh, fcntl.LOCK_UN)
    t0 = time.monotonic()
    g = golden.build()
    c = _prepare_clone(g["name"], vmid)
    try:
        c.timings["clone"] = c.clone_s
        if "--trainer" in argv:
            with tempfile.TemporaryDirectory() as d:
                c.timings["trainer_install"] = install_trainer(c, build_trainer_wheel(Path(d)))
            c.timings["make_tiny"] = make_tiny(c)
    except BaseException:
        lxc.stop(str(vmid), kill=True)
        lxc.destroy(str(vmid))
        raise
    c.timings["total"] = time.monotonic() - t0
    print(json.dumps({"created": vmid, "golden": g["name"], "golden_built": g["built"],
                      "timings": {k: round(v, 2) for k, v in c.timings.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
