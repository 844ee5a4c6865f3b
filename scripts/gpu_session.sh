#!/usr/bin/env bash
# The GPU measurements issue 72 waits for, as one script of at most 7 minutes (docs/gpu.md):
# `plugin-repro gpu-check` with the paper preflight's rates first (the concurrency curve at 1, 4,
# 8 and 12 trainings at once with their weights compared, a step's host and device milliseconds,
# LoRA with and without recomputed activations), then bench_gpu.py's static-cache section, then
# notebook 15 with papermill, then bench_mps.py (the curve with and without CUDA MPS, where a
# private daemon starts); the deadline cuts what is left. Everything goes to
# results/gpu/<gpu>_<date>/, or, where the device tool's $OUT is set, to $OUT/<gpu>_<date>/: each file
# as its step ends, so that a call cut short by its timeout still brings back what finished.
#
#   bash scripts/gpu_session.sh STASH [DEADLINE_S]
#
# STASH: the folder `scripts/offline_bundle.py stash` put the carried parts in (a machine that
# reaches no package index; the bundle brings SmolLM2's weights), or `none` where the package
# is installed. On a CPU it rehearses the same steps on the small twins (paper-twin).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stash="${1:?the stash folder, or none}" deadline="${2:-420}"
py="${PLUGIN_PYTHON:-python3}"
cd "$root"
if [ "$stash" != none ]; then
  exports="$("$py" scripts/offline_bundle.py install "$stash" /tmp/offline)"  # stops here if a part is missing
  eval "$exports"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
label="$("$py" -c 'from plugin_lib.commands.gpu_check import device_label; print(device_label())')"
dir="${OUT:-results/gpu}/${label}_$(date -u +%F)"
exec "$py" -m plugin_lib.commands.gpu_check --out "$dir" --deadline-s "$deadline" --only 15 --skip tests --bench static
