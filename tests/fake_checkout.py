"""A copy of this checkout in a temporary folder, with tiny fake notebooks (a parameters cell and
one cell that succeeds, raises or sleeps) and, unless asked for the real ones, fake data check and
preflight, for the tests of run_all.sh (tests/test_run_all.py, tests/test_run_all_doors.py) and of
the stamps and records it checks (tests/test_run_stamp.py, tests/test_record_integrity.py). The
environment is the one running the tests (PLUGIN_VENV, PLUGIN_SKIP_BOOTSTRAP=1).
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
NEEDS = pytest.mark.skipif(  # the pytestmark of the tests that run run_all.sh on a fake checkout
    not (VENV / "bin" / "python").exists() or shutil.which("git") is None,
    reason="needs the tests to run in a virtual environment (PLUGIN_VENV) and git")

# A data check that passes, or fails when FAKE_DATA_CHECK=fail, standing in for the real one.
FAKE_CHECK = '''import os, sys
def main(argv=None, profiles=None):
    if os.environ.get("FAKE_DATA_CHECK") == "fail":
        print("Missing e2e_cleaned/test-fixed.csv: download it with plugin-repro data fetch", file=sys.stderr)
        return 2
    print("[check] data ready", flush=True)
    return 0
'''
# The preflight (paper runs only), standing in for the real one: FAKE_PREFLIGHT=fail says it
# will not fit, as the real one does when GPU memory or disk is short.
FAKE_PREFLIGHT = '''import os, sys
def main(argv):
    if "--disk-only" in argv:  # the disk check every profile makes before its first notebook
        names = argv[argv.index("--disk-only") + 1:]
        if os.environ.get("FAKE_DISK") == "short":
            print("NOT ENOUGH DISK: 3.2 GiB of disk short for", *names, flush=True)
            return 1
        print("Disk: fine for", *names, flush=True)
        return 0
    print("[preflight] plan of profile", argv[argv.index("--profile") + 1], flush=True)
    if os.environ.get("FAKE_PREFLIGHT") == "fail":
        print("WILL NOT FIT: 10_distribution_shift needs about 144 GiB of GPU memory", flush=True)
        return 1
    print("Estimated total: 42 hours at most", flush=True)
    return 0
'''
# The registry with the test's notebooks in place of the real ones (a real study keeps its declaration).
FAKE_STUDIES = '''
STUDIES = tuple(BY_NOTEBOOK.get(name) or Study(name, name, (), (), in_notebook="a test notebook")
                for name in {names!r})
NOTEBOOKS = tuple(study.notebook for study in STUDIES)
BY_NOTEBOOK = {{study.notebook: study for study in STUDIES}}
'''
OK = '''import os, plugin_lib
from plugin_lib.harness.machine import results_dir
here = os.path.dirname(os.getcwd())  # the notebooks run in <checkout>/notebooks
print("plugin_lib from", plugin_lib.__file__)
assert plugin_lib.__file__.startswith(here + os.sep), plugin_lib.__file__
(results_dir(profile) / "marker.txt").write_text("written by the notebook")
'''
FAIL = '''class MissingDataError(FileNotFoundError):
    pass
raise MissingDataError("Missing e2e_cleaned/test-fixed.csv in PLUGIN_DATA_DIR=/nowhere.\\n"
                       "Download it with: plugin-repro data fetch --only e2e")
'''
SLEEP = '''import time
print("sleeping", flush=True)
time.sleep(60)
'''


def notebook(body: str, profile: str = "smoke", parameters: str = "") -> str:
    def code(source, tags=()):
        return {"cell_type": "code", "execution_count": None, "metadata": {"tags": list(tags)},
                "outputs": [], "source": source}
    return json.dumps({
        "cells": [code(f'profile = "{profile}"' + parameters, ["parameters"]), code(body)],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                     "language_info": {"name": "python"}},
        "nbformat": 4, "nbformat_minor": 4}, indent=1)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def _real_parameters(name: str) -> str:
    """A real notebook's parameters but its profile (the registry plans its units from them)."""
    path = ROOT / "notebooks" / f"{name}.ipynb"
    if not path.is_file():
        return ""
    cell = next(c for c in json.loads(path.read_text())["cells"] if "parameters" in c["metadata"].get("tags", []))
    return "".join("\n" + line for line in "".join(cell["source"]).splitlines() if not line.startswith("profile ="))


def make_repo(tmp: Path, notebooks: dict[str, str], real_check: bool = False) -> Path:
    """The checkout (tracked and untracked, not ignored files; no results/) copied to ``tmp``,
    with ``notebooks`` as notebooks/, a small committed results/local, committed in a new git
    repository."""
    repo = tmp / "repo"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], check=True, capture_output=True, text=True).stdout
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if rel.startswith(("results/", "notebooks/")) or not src.is_file():
            continue
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, repo / rel)
    for name, body in notebooks.items():
        (repo / "notebooks").mkdir(exist_ok=True)
        (repo / "notebooks" / f"{name}.ipynb").write_text(notebook(body, parameters=_real_parameters(name)))
    registry = repo / "plugin_lib" / "commands" / "studies.py"
    registry.write_text(registry.read_text() + FAKE_STUDIES.format(names=sorted(notebooks)))
    if not real_check:
        (repo / "plugin_lib" / "data" / "check.py").write_text(FAKE_CHECK)
        (repo / "plugin_lib" / "commands" / "preflight.py").write_text(FAKE_PREFLIGHT)
    local = repo / "results" / "local"
    (local / "executed").mkdir(parents=True)
    (local / "REPORT.md").write_text("# the committed local report\n")
    (local / "executed" / "00_ok.ipynb").write_text(notebook(OK, "local"))
    (local / "executed" / "00_ok.done").write_text("0" * 64 + "\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy")
    return repo


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PLUGIN_", "FAKE_")) and k not in ("PYTHONPATH", "PLUGIN_DATA_DIR")}
    base.update(PLUGIN_VENV=str(VENV), PLUGIN_SKIP_BOOTSTRAP="1", HF_HUB_OFFLINE="1",
                PYTHONPATH="/nonexistent-elsewhere", PYTHONDONTWRITEBYTECODE="1")
    base.update(extra)
    return base


def run_all(repo: Path, *args: str, umask: int = 0o022, timeout: float = 120, **extra: str):
    return subprocess.run(["bash", "-c", f'umask {umask:03o}; exec bash run_all.sh "$@"', "run_all", *args],
                          cwd=repo, env=env(**extra), capture_output=True, text=True, timeout=timeout)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.suffix == ".tmp")


def run_stamp():
    from plugin_lib.commands import stamp

    return stamp
