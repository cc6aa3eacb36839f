#!/bin/bash
# Run the real-LXC Molecule scenario from the repository root: tests/harness/molecule.sh [test|converge|...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$root/.collections"
exec molecule "${1:-test}" -s default "${@:2}"
