#!/usr/bin/env bash
# The test command: builds .venv if needed, then runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash run_tests.sh -k combine -x`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$root/scripts/bootstrap_env.sh"
cd "$root"
exec "${PLUGIN_VENV:-$root/.venv}/bin/python" -m pytest "$@"
