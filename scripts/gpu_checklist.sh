#!/usr/bin/env bash
# The standing GPU checklist (docs/gpu.md), on a machine with a CUDA GPU: the GPU tests, the
# benchmark on the full-size twins, and the paper profile's plan with rates measured here
# (saved, so that any machine can plan with them: preflight --rates FILE). Logs go to
# results/gpu/<gpu>_<date>/ (GPU_CHECK_DIR overrides).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
gpu=$("$py" -c "import torch; print(torch.cuda.get_device_name(0).split()[-1].lower() if torch.cuda.is_available() else '')")
[ -n "$gpu" ] || { echo "gpu_checklist.sh: no CUDA GPU here; see docs/gpu.md for what runs on a CPU." >&2; exit 1; }
out=${GPU_CHECK_DIR:-results/gpu/${gpu}_$(date +%F)}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/nvidia_smi.txt"
"$py" -m pytest -m gpu tests/test_gpu.py -q --durations=5 2>&1 | tee "$out/pytest_gpu.log"
"$py" benchmarks/bench_gpu.py 2>&1 | tee "$out/bench_gpu.log"
"$py" -m plugin_lib.harness.preflight --profile paper --save-rates "$out/paper_rates.json" 2>&1 | tee "$out/preflight.log"
echo "gpu_checklist.sh: logs and rates in $out; put the numbers, with the GPU named, in docs/gpu.md"
