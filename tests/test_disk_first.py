"""Disk first (issue 46, item 5): before the first notebook, a run checks what the notebooks still
to run may write (the preflight's plan, less what the profile already stores) against the free
disk, and names the shortfall. run_all.sh's side is in test_run_all_doors.py; a unit that fails on a
full disk leaving no checkpoint is in test_runner.py."""
from __future__ import annotations

import functools
import io
import os
import shutil
import subprocess

import pytest

import real_data
from plugin_lib.commands import preflight as preflight_command
from plugin_lib.harness.planning import preflight
from plugin_lib.harness.machine import results_dir
from plugin_lib.harness.profile import load_profile


@functools.lru_cache(maxsize=1)
def smoke_plans():
    """The smoke profile's plan, counted once (about 10 s): the checks below only filter it."""
    return preflight_command.plans(load_profile("smoke"))


@pytest.fixture
def planned(monkeypatch, tmp_path):
    real_data.require("e2e", "webnlg", "commongen", "adidas")
    plans = smoke_plans()
    monkeypatch.setattr(preflight_command, "plans",
                        lambda profile, only=(), gpu_name=None: [p for p in plans if p.notebook in only])
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("PLUGIN_CACHE_DIR", str(tmp_path / "cache"))
    return {plan.notebook: plan.tally.disk_bytes for plan in plans}


def test_the_shortfall_is_named_and_what_is_stored_counts(planned):
    e2e = planned["01_table1_e2e"]
    assert e2e > 0
    out = io.StringIO()
    assert preflight_command.disk_check("smoke", ["01_table1_e2e"], disk_free_gb=0.01, out=out) == 1
    text = out.getvalue()
    short = (e2e - 0.01 * preflight.GIB) / preflight.GIB
    assert text.startswith(f"NOT ENOUGH DISK: {short:,.1f} GiB of disk short") and "PLUGIN_RESULTS_DIR" in text

    # A resumed run: what the profile already stores is not written again (a sparse file of that size).
    stored = results_dir("smoke") / "runs" / "e2e" / "smollm2-135m-instruct" / "cache" / "base-x.npy"
    stored.parent.mkdir(parents=True)
    with open(stored, "wb") as f:
        f.truncate(e2e)
    assert preflight.stored_bytes(load_profile("smoke")) == e2e
    out = io.StringIO()
    assert preflight_command.disk_check("smoke", ["01_table1_e2e"], disk_free_gb=0.01, out=out) == 0
    assert out.getvalue().startswith("Disk: the notebooks to run may write up to")

    # Notebooks that write nothing need nothing.
    stored.unlink()
    assert preflight_command.disk_check("smoke", ["00_dataset_statistics", "13_theorem1_convergence"], disk_free_gb=0,
                                out=io.StringIO()) == 0


def test_the_disk_is_read_where_results_and_caches_go(planned, tmp_path, monkeypatch):
    """On a real small disk (an 8 MiB tmpfs, mounted where this user may mount one)."""
    small = tmp_path / "small"
    small.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("needs a tmpfs mount (root)")
    try:
        monkeypatch.setenv("PLUGIN_CACHE_DIR", str(small / "cache"))
        out = io.StringIO()
        assert preflight_command.disk_check("smoke", ["01_table1_e2e"], out=out) == 1
        assert "0.0 GiB are free" in out.getvalue() and str(small / "cache") in out.getvalue()
        assert preflight_command.main(["--profile", "smoke", "--disk-only", "00_dataset_statistics"]) == 0
    finally:
        subprocess.run(["umount", str(small)], check=False)
