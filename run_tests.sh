#!/usr/bin/env bash
# The test command: builds .venv if needed, then runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash run_tests.sh -k combine -x`.
# PLUGIN_SKIP_BOOTSTRAP=1 uses ${PLUGIN_VENV:-.venv} as it is (no check against requirements.txt).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ "${PLUGIN_SKIP_BOOTSTRAP:-0}" != 1 ]; then bash "$root/scripts/bootstrap_env.sh"; fi
cd "$root"
exec "${PLUGIN_VENV:-$root/.venv}/bin/python" -m pytest "$@"
