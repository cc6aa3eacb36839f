#!/bin/bash
# Run a real-LXC Molecule scenario from the repository root:
#   tests/harness/molecule.sh [test|converge|...] [default|provision] [more molecule args]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$root/.collections"
exec molecule "${1:-test}" -s "${2:-default}" "${@:3}"
