#!/usr/bin/env bash
# The test command: builds .venv if needed, then runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash run_tests.sh -k combine -x`.
# PLUGIN_SKIP_BOOTSTRAP=1 uses ${PLUGIN_VENV:-.venv} as it is (no check against requirements.txt).
# The test files are spread over the cores (pytest-xdist), one thread each; a file stays on one
# worker, so its module fixtures (a live server, a Ray cluster) are built once. On 2 cores the suite
# takes 20 minutes (1,178-1,265 s in five runs, 2026-12-06; starting the longest files first
# balanced the workers but gained nothing beyond that spread); in .ci/run, beside smoke's last
# minutes, 1,461 and 1,534 s. PLUGIN_TEST_WORKERS sets the workers (0: one process, e.g. --pdb).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ "${PLUGIN_SKIP_BOOTSTRAP:-0}" != 1 ]; then bash "$root/scripts/bootstrap_env.sh"; fi
cd "$root"
GLIBC_TUNABLES="$(PYTHONPATH="$root" "${PLUGIN_VENV:-$root/.venv}/bin/python" -m plugin_lib.utils.malloc)"
export GLIBC_TUNABLES  # glibc's allocator set for tensors (plugin_lib/utils/malloc.py)
workers="${PLUGIN_TEST_WORKERS:-auto}" spread=()
for arg in "$@"; do case "$arg" in -n|-n*|--numprocesses*|--pdb|--trace) workers=0 ;; esac; done
if [ "$workers" != 0 ]; then
  spread=(-n "$workers" --dist loadfile)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
fi
exec "${PLUGIN_VENV:-$root/.venv}/bin/python" -m pytest "${spread[@]}" "$@"
