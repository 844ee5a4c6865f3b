#!/usr/bin/env bash
# Reproduces everything: every numbered notebook in notebooks/, in order, with papermill.
#   bash run_all.sh                  # profile chosen automatically: paper (CUDA GPU + Hub; colab on Colab) or local
#   bash run_all.sh --profile smoke  # a profile of plugin_lib/harness/profiles.yaml (docs/profiles.md)
#   bash run_all.sh --force          # re-run notebooks that already finished
#   bash run_all.sh --only 01        # only notebooks whose name starts with 01
#   bash run_all.sh --no-fetch       # do not download missing data; stop instead
#   bash run_all.sh --executor ray   # first compute the notebooks' units (local, ray or slurm)
#   bash run_all.sh --help           # every option, what a call does and its exit statuses
# This script builds the environment (.venv, scripts/bootstrap_env.sh; PLUGIN_VENV names another,
# PLUGIN_SKIP_BOOTSTRAP=1 uses it as it is), then hands over to the orchestrator,
# plugin_lib/commands/run.py, the same as `plugin-repro run`: the data, the preflight, one call
# per profile at a time, stamps, papermill with atomic replacement, the report.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${PLUGIN_VENV:-$root/.venv}"
if [ "${PLUGIN_SKIP_BOOTSTRAP:-0}" = 1 ]; then
  [ -x "$venv/bin/python" ] || { echo "run_all.sh: PLUGIN_SKIP_BOOTSTRAP=1 but $venv/bin/python does not exist" >&2; exit 1; }
else
  bash "$root/scripts/bootstrap_env.sh"
fi
# This checkout's plugin_lib, whatever package the environment has installed; glibc's allocator
# set for tensors in every process started from here (plugin_lib/utils/malloc.py).
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
GLIBC_TUNABLES="$("$venv/bin/python" -m plugin_lib.utils.malloc)"
export GLIBC_TUNABLES
PLUGIN_RUN_COMMAND=run_all.sh exec "$venv/bin/python" -m plugin_lib.commands.run "$@"
