#!/bin/bash
# One entry point for the real-container harness (idempotent):
#   1. apt-get install lxc debootstrap openssh-server chromium when missing (chromium: the run report's test opens
#      the page headless, tests/integration/test_watch_run_local.py)
#   2. fetch the trainer's heavy wheels (torch 2.13.0 CPU, transformers, ...) into .cache/harness/wheels
#   3. build the golden container dflash-golden-<hash8> if its recipe changed (else keep it), prune older ones
# Then:  .venv/bin/python -m pytest -m containers tests/containers      and   tests/harness/molecule.sh test
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
if [ "$(id -u)" != 0 ]; then
    echo "setup.sh: the real-container harness needs root (lxc-create, lxc-attach, sshd); skipping" >&2
    exit 0
fi
missing=()
command -v lxc-create >/dev/null || missing+=(lxc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup.sh: apt-get install ${missing[*]}" >&2
    apt-get update -qq
    # (debconf's "delaying package configuration, since apt-utils is not installed" is no news on a bare machine)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" 2>&1 >/dev/null |
        { grep -v '^debconf: delaying package configuration' || true; } >&2
fi
cd "$root/tests"
"$py" -m harness.golden build
