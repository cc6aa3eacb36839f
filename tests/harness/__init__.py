"""Real-container test harness for dflash.ops.

Real LXC containers named after their vmid, a `pct` stand-in (bin/pct) that maps the Proxmox CLI onto lxc-*,
and an sshd on 127.0.0.1 so that Ansible reaches the "Proxmox host" the way production does (ssh -tt).
See tests/harness/README.md.
"""
from pathlib import Path

HARNESS_DIR = Path(__file__).resolve().parent
REPO_ROOT = HARNESS_DIR.parents[1]
BIN_DIR = HARNESS_DIR / "bin"
PCT = BIN_DIR / "pct"
CACHE_DIR = REPO_ROOT / ".cache" / "harness"  # /.cache/ is git-ignored
WHEEL_DIR = CACHE_DIR / "wheels"
# Container names (vmids) are machine-wide, so the locks that guard them are too: one per machine, not per checkout
# (a CI clone and a working checkout ran harness sessions at once and fought over CT 200).
LOCK_DIR = Path("/run/lock/dflash-harness")
# Where the harness installs the trainer inside a container (golden venv + per-clone trainer wheel).
CT_VENV = "/opt/dflash/venv"
CT_WHEELS = "/opt/dflash/wheels"
