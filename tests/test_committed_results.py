"""The committed results are current: a fresh clone's `run_all.sh --profile local` finds every
notebook's stamp matching and re-runs nothing (commands/stamp.py says what a stamp hashes).
A change to the code, a notebook, the profile or the data that could change a result makes this
fail until results/local is re-run (`bash run_all.sh --profile local`) and committed with it.

Notebook 14 is checked only where llama-cpp-python's server is installed (the extra `api`):
elsewhere it cannot be re-executed, only skipped, and its committed execution is kept."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from plugin_lib.harness import api_server
from plugin_lib.harness.profile import REPO_ROOT

NEEDS_SERVER = "14_api_model"


def test_every_committed_local_stamp_matches_the_current_inputs():
    notebooks = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if api_server.llama_cpp_missing():
        notebooks = [n for n in notebooks if NEEDS_SERVER not in n]
    committed = {k: v for k, v in os.environ.items() if k != "PLUGIN_RESULTS_DIR"}  # the checkout's results/
    check = subprocess.run([sys.executable, "-m", "plugin_lib.commands.stamp", "--check", "--profile", "local", *notebooks],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=committed)
    assert check.returncode == 0, check.stderr


# -- the committed reports are what the code makes of the committed results (issue 73) ---------

REPORTED = ("local", "confirm", "wave3", "wave4")


@pytest.mark.parametrize("profile", REPORTED)
def test_each_committed_report_is_current(profile, monkeypatch):
    """A report that says runs are under way while their records exist, or lacks a section, is
    not what the code makes of the results: `plugin-repro report --profile NAME` mends it."""
    from plugin_lib.harness.profile import load_profile
    from plugin_lib.commands.document import report_text

    monkeypatch.delenv("PLUGIN_RESULTS_DIR", raising=False)
    committed = (REPO_ROOT / "results" / profile / "REPORT.md").read_text(encoding="utf-8")
    assert committed == report_text(load_profile(profile)), (
        f"results/{profile}/REPORT.md is stale: `plugin-repro report --profile {profile}` rewrites it")


def test_the_readme_results_block_is_current(monkeypatch):
    from plugin_lib.commands.document import readme_text

    monkeypatch.delenv("PLUGIN_RESULTS_DIR", raising=False)
    assert (REPO_ROOT / "README.md").read_text(encoding="utf-8") == readme_text("local"), (
        "the README's results block is stale: `plugin-repro report --profile local --readme` rewrites it")


def test_no_committed_report_says_runs_are_under_way_once_their_records_exist():
    from plugin_lib.report import freeze

    judged = {"wave 2": (any((REPO_ROOT / "results" / "confirm" / "claims").glob("wave2_*.json")), freeze.WAVE2_FROZEN_AT),
              "wave 3": (any((REPO_ROOT / "results" / "wave3" / "claims").glob("wave3_*.json")), freeze.WAVE3_FROZEN_AT)}
    # wave 4's rows are per group: a row may say its runs are under way only while none of its claims is judged
    from plugin_lib.report import preregistered_wave4 as wave4

    waiting = sum(not any((REPO_ROOT / "results" / "wave4" / "claims" / f"{c.key}.json").exists()
                          for c in wave4.CLAIMS if wave4.group(c) == g) for g in wave4.GROUPS)
    for report in [REPO_ROOT / "README.md", *(REPO_ROOT / "results" / p / "REPORT.md" for p in REPORTED)]:
        text = report.read_text(encoding="utf-8")
        for wave, (stored, frozen_at) in judged.items():
            assert not (stored and f"{wave} under way" in text), f"{report} says {wave} is under way; its records exist"
            assert not (stored and f"rules frozen at {frozen_at[:7]}; runs under way" in text), (
                f"{report} says {wave}'s runs are under way; its claims are judged")
        said = text.count(f"rules frozen at {freeze.WAVE4_FROZEN_AT[:7]}; runs under way")
        assert said <= waiting, f"{report}: {said} wave-4 rows say their runs are under way, {waiting} groups wait"
