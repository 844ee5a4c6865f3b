"""What stops run_all.sh before its first notebook, on a fake checkout (tests/fake_checkout.py):
the real data check without data (and the fetch from a mirror that mends it), the preflight of a
paper run, the disk check of every profile, and a grid executor whose engine is not installed.
The rest of run_all.sh's behaviour is in tests/test_run_all.py.
"""
from __future__ import annotations

import os
import time

import real_data
from fake_checkout import NEEDS, OK, git, make_repo, run_all

pytestmark = NEEDS


def test_without_data_it_stops_fast_and_the_checkout_stays_clean(tmp_path):
    """A fresh clone, no data, no Hub, plain `bash run_all.sh`: the profile is chosen (local: no
    Hub) and the real data check stops the call before any notebook."""
    repo = make_repo(tmp_path, {"00_ok": OK}, real_check=True)
    start = time.monotonic()
    result = run_all(repo, timeout=60)
    assert result.returncode != 0
    assert "profile: local" in result.stdout
    assert time.monotonic() - start < 30
    assert "fetching the missing data" in result.stdout and "[fetch] no network" in result.stdout
    assert "still not ready" in result.stderr
    assert "00_ok: running" not in result.stdout
    assert git(repo, "status", "--porcelain", "--ignored") == ""
    no_fetch = run_all(repo, "--no-fetch", timeout=60)
    assert no_fetch.returncode != 0 and "fetching" not in no_fetch.stdout


def test_missing_data_is_fetched_first_then_the_notebooks_run(tmp_path):
    """A fresh clone whose data/ is empty, with a mirror of the data (a folder laid out like
    data/, as PLUGIN_DATA_MIRROR): run_all.sh fetches every file, checks it and goes on."""
    mirror = real_data.require()
    repo = make_repo(tmp_path, {"00_ok": OK}, real_check=True)
    result = run_all(repo, "--profile", "smoke", PLUGIN_DATA_MIRROR=str(mirror), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fetching the missing data" in result.stdout and "00_ok: done" in result.stdout
    assert (repo / "data" / "e2e_cleaned" / "test-fixed.csv").read_bytes() == \
        (mirror / "e2e_cleaned" / "test-fixed.csv").read_bytes()
    assert git(repo, "status", "--porcelain") == ""  # data/ and results/smoke are ignored


def test_a_paper_run_prints_its_preflight_plan_first(tmp_path):
    repo = make_repo(tmp_path, {"00_ok": OK})
    result = run_all(repo, "--profile", "paper")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[preflight] plan of profile paper" in result.stdout
    assert result.stdout.index("Estimated total") < result.stdout.index("00_ok: running")


def test_a_preflight_that_will_not_fit_stops_a_paper_run_before_anything_is_written(tmp_path):
    repo = make_repo(tmp_path, {"00_ok": OK})
    result = run_all(repo, "--profile", "paper", FAKE_PREFLIGHT="fail")
    assert result.returncode == 1
    assert "WILL NOT FIT" in result.stdout and "nothing was run or written" in result.stderr
    assert "00_ok: running" not in result.stdout
    assert git(repo, "status", "--porcelain", "--ignored") == ""
    skipped = run_all(repo, "--profile", "paper", "--only", "00", FAKE_PREFLIGHT="fail",
                      PLUGIN_SKIP_PREFLIGHT="1")
    assert skipped.returncode == 0 and "[preflight]" not in skipped.stdout


def test_a_short_disk_stops_the_run_before_the_first_notebook_naming_the_shortfall(tmp_path):
    repo = make_repo(tmp_path, {"00_ok": OK, "01_ok": OK})
    result = run_all(repo, "--profile", "smoke", FAKE_DISK="short")
    assert result.returncode == 1
    assert "NOT ENOUGH DISK: 3.2 GiB of disk short for 00_ok 01_ok" in result.stdout
    assert "nothing was run" in result.stderr and "running" not in result.stdout
    assert not (repo / "results" / "smoke" / "marker.txt").exists()
    done = run_all(repo, "--profile", "smoke", "--only", "00")
    assert done.returncode == 0 and "Disk: fine for 00_ok\n" in done.stdout  # only what will run is checked
    assert run_all(repo, "--profile", "smoke", FAKE_DISK="short", PLUGIN_SKIP_PREFLIGHT="1").returncode == 0
    again = run_all(repo, "--profile", "smoke", FAKE_DISK="short")  # nothing left to run: nothing to check
    assert again.returncode == 0 and "DISK" not in again.stdout and "already finished" in again.stdout


def test_a_missing_executor_engine_is_exit_2_and_claims_nothing_about_resuming(tmp_path):
    """--executor ray without ray: the grid cannot start, so run_all.sh exits 2 saying nothing
    was computed (not 'finished units are stored, so a rerun resumes'), and no notebook runs."""
    real_data.require("e2e")  # the grid plans the smoke profile's units from the data
    repo = make_repo(tmp_path, {"01_table1_e2e": OK}, real_check=True)  # the grid imports the real preflight
    no_ray = tmp_path / "no-ray" / "ray"
    no_ray.mkdir(parents=True)
    (no_ray / "__init__.py").write_text('raise ImportError("ray is not installed here (a test)")\n')
    done = run_all(repo, "--profile", "smoke", "--only", "01", "--executor", "ray", timeout=300,
                   PYTHONPATH=str(no_ray.parent), PLUGIN_DATA_DIR=os.environ["PLUGIN_DATA_DIR"],
                   PLUGIN_RESULTS_DIR=str(tmp_path / "results"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "could not start" in done.stderr and "nothing was computed" in done.stderr
    both = done.stdout + done.stderr  # the grid's own lines go through its log (tee) to stdout
    assert "rerun resumes" not in both and "pip install 'plugin-repro[ray]'" in both
    assert not (tmp_path / "results" / "smoke" / "marker.txt").exists()  # no notebook ran
