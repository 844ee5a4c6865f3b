"""The committed results are current: a fresh clone's `run_all.sh --profile local` finds every
notebook's stamp matching and re-runs nothing (scripts/run_stamp.py says what a stamp hashes).
A change to the code, a notebook, the profile or the data that could change a result makes this
fail until results/local is re-run (`bash run_all.sh --profile local`) and committed with it.

Notebook 14 is checked only where llama-cpp-python's server is installed (the extra `api`):
elsewhere it cannot be re-executed, only skipped, and its committed execution is kept."""
from __future__ import annotations

import subprocess
import sys

from plugin_lib.harness import api_server
from plugin_lib.harness.profile import REPO_ROOT

NEEDS_SERVER = "14_api_model"


def test_every_committed_local_stamp_matches_the_current_inputs():
    notebooks = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if api_server.llama_cpp_missing():
        notebooks = [n for n in notebooks if NEEDS_SERVER not in n]
    check = subprocess.run([sys.executable, "scripts/run_stamp.py", "--check", "--profile", "local", *notebooks],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr
