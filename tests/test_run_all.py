"""run_all.sh at the shell level (issue 19), on a fake checkout (tests/fake_checkout.py): a copy
of the repository in a temporary folder whose notebooks/ holds tiny fake notebooks.

Covered: success writes the executed notebook and its stamp with normal permissions, a second
call skips it whatever the environment variables; a failure keeps the last executed notebook,
clears the stamp, leaves <name>.failed.ipynb and prints the package's own message; an unknown
or missing --only/--profile value, a bad profiles.yaml, an unwritable results or cache folder;
a second call refused while one runs, an interrupt that leaves nothing half-written, what killed
writers left; PLUGIN_RESULTS_DIR; this checkout's plugin_lib imported; a failing data check that
writes nothing; the README written only by a complete local run. What stops a run before its
first notebook (data, preflight, disk, executor) is in tests/test_run_all_doors.py, the stamps in
tests/test_run_stamp.py.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from fake_checkout import FAIL, NEEDS, OK, SLEEP, env, git, leftovers, make_repo, mode, notebook, run_all, run_stamp
from plugin_lib.utils.locks import StoreLock

pytestmark = NEEDS


# -- a finished notebook, then a second call, then a failure ------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("finished"), {"00_ok": OK})
    result = run_all(repo, "--profile", "smoke", umask=0o027)
    assert result.returncode == 0, result.stdout + result.stderr
    return repo, result


def test_success_writes_the_executed_notebook_and_its_stamp(finished):
    repo, result = finished
    executed = repo / "results" / "smoke" / "executed"
    assert "00_ok: done" in result.stdout
    notebook_out = json.loads((executed / "00_ok.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in notebook_out["cells"] for o in c.get("outputs", []))
    assert "plugin_lib from plugin_lib/__init__.py" in printed  # this checkout's, path scrubbed
    want = run_stamp().stamp(repo / "notebooks" / "00_ok.ipynb", "smoke", code=run_stamp().code_version(repo))
    assert (executed / "00_ok.done").read_text().strip() == want
    assert leftovers(executed) == [] and not (executed / "00_ok.failed.ipynb").exists()
    assert (repo / "results" / "smoke" / "marker.txt").exists()
    assert (repo / "results" / "smoke" / "REPORT.md").exists()
    # the user's permissions (umask 027), not mkstemp's 0600, for papermill's output and the library's
    for path in (executed / "00_ok.ipynb", executed / "00_ok.done", repo / "results" / "smoke" / "REPORT.md"):
        assert mode(path) == 0o640, path
    assert git(repo, "status", "--porcelain") == ""  # results/smoke is ignored; README untouched


def test_a_second_call_skips_it_whatever_the_environment(finished, tmp_path):
    repo, _ = finished
    os.utime(repo / "notebooks" / "00_ok.ipynb")  # a newer file time is not a change
    result = run_all(repo, "--profile", "smoke", HOME=str(tmp_path), LANG="C", TMPDIR=str(tmp_path),
                     CUDA_VISIBLE_DEVICES="", SOME_UNRELATED_SETTING="1", PYTHONHASHSEED="7")
    assert result.returncode == 0, result.stderr
    assert "00_ok: already finished, skipped" in result.stdout


def test_lock_is_released_after_a_call(finished):
    repo, _ = finished
    assert not StoreLock(repo / "results" / "smoke" / ".run_all.lock").busy()


def test_failure_keeps_the_executed_notebook_and_prints_the_package_message(finished):
    repo, _ = finished
    smoke = repo / "results" / "smoke"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in
              (smoke / "executed" / "00_ok.ipynb", smoke / "REPORT.md", smoke / "marker.txt")}
    stamp_before = (smoke / "executed" / "00_ok.done").read_bytes()
    (repo / "notebooks" / "00_ok.ipynb").write_text(notebook(FAIL))
    result = run_all(repo, "--profile", "smoke")
    assert result.returncode == 1
    # the package's own words, in full, after a traceback of any length
    assert "MissingDataError: Missing e2e_cleaned/test-fixed.csv in PLUGIN_DATA_DIR=/nowhere." in result.stderr
    assert "Download it with: plugin-repro data fetch --only e2e" in result.stderr
    assert "unchanged" in result.stderr
    for path, (content, mtime) in before.items():
        assert path.read_bytes() == content and path.stat().st_mtime_ns == mtime, path
    assert stamp_before == (smoke / "executed" / "00_ok.done").read_bytes()  # kept; it no longer matches
    failed = json.loads((smoke / "executed" / "00_ok.failed.ipynb").read_text())
    assert any(o.get("ename") == "MissingDataError" for c in failed["cells"] for o in c.get("outputs", []))
    assert leftovers(smoke / "executed") == []
    # the stale stamp does not match: the next call runs it again (and fails again), never "already finished"
    again = run_all(repo, "--profile", "smoke", "--only", "00")
    assert again.returncode == 1 and "already finished" not in again.stdout


# A study that needs an optional engine: it runs when FAKE_ENGINE=present, else records a skip.
ENGINE = '''import os
from plugin_lib.report import writer
from plugin_lib.harness.machine import results_dir
if os.environ.get("FAKE_ENGINE") == "present":
    (results_dir(profile) / "engine_table.txt").write_text("ran with the engine")
    writer._clear_skip("engine_table", profile)
    print("the study ran")
else:
    writer.save_skip("engine_table", profile, "the engine is not installed")
    print("the study skipped")
'''


def test_a_skip_for_a_missing_engine_keeps_the_last_execution_that_ran(tmp_path):
    repo = make_repo(tmp_path, {"00_engine": ENGINE})
    smoke = repo / "results" / "smoke"
    ran = run_all(repo, "--profile", "smoke", FAKE_ENGINE="present")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    executed, stamp = smoke / "executed" / "00_engine.ipynb", smoke / "executed" / "00_engine.done"
    kept = {path: path.read_bytes() for path in (executed, stamp, smoke / "engine_table.txt")}
    assert "the study ran" in executed.read_text()
    skipped = run_all(repo, "--profile", "smoke", "--force")
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "skipped its study (the engine is not installed)" in skipped.stdout
    assert "are kept" in skipped.stdout
    assert {path: path.read_bytes() for path in kept} == kept
    assert not (smoke / "skipped" / "engine_table.json").exists()
    assert leftovers(smoke / "executed") == []
    # with no execution that ran it, the skip is the execution, and its record stays for the report
    fresh = make_repo(tmp_path / "fresh", {"00_engine": ENGINE})
    first = run_all(fresh, "--profile", "smoke")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "the study skipped" in (fresh / "results" / "smoke" / "executed" / "00_engine.ipynb").read_text()
    assert (fresh / "results" / "smoke" / "skipped" / "engine_table.json").is_file()


# -- arguments ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def idle_repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("idle"), {"00_ok": OK, "01_fail": FAIL})


def test_unknown_only_lists_the_notebooks_and_writes_nothing(idle_repo):
    result = run_all(idle_repo, "--profile", "local", "--only", "7")
    assert result.returncode == 2
    assert "no notebook name starts with '7'" in result.stderr
    assert "00_ok" in result.stderr and "01_fail" in result.stderr
    assert git(idle_repo, "status", "--porcelain", "--ignored") == ""


@pytest.mark.parametrize("args", [["--only"], ["--profile"], ["--profile", "--force"], ["--only="]])
def test_an_option_without_its_value_is_a_clear_error(idle_repo, args):
    result = run_all(idle_repo, *args)
    assert result.returncode == 2
    assert "needs a value" in result.stderr and "unbound variable" not in result.stderr


def test_unknown_profile(idle_repo):
    result = run_all(idle_repo, "--profile", "nope")
    assert result.returncode == 2 and "unknown profile 'nope'" in result.stderr
    assert git(idle_repo, "status", "--porcelain", "--ignored") == ""


def test_a_held_lock_refuses_at_once(idle_repo):
    lock = idle_repo / "results" / "smoke" / ".run_all.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(lock, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            start = time.monotonic()
            result = run_all(idle_repo, "--profile", "smoke")
            assert result.returncode == 3
            assert "another run (run_all.sh or plugin-repro run) is already running for profile 'smoke'" in result.stderr
            assert time.monotonic() - start < 10
        assert not (idle_repo / "results" / "smoke" / "executed").exists()
    finally:
        shutil.rmtree(idle_repo / "results" / "smoke")


# -- a second call while one runs, then an interrupt --------------------------------------------

def test_a_second_call_refuses_and_an_interrupt_leaves_nothing_half_written(tmp_path):
    repo = make_repo(tmp_path, {"00_sleep": SLEEP})
    executed = repo / "results" / "smoke" / "executed"
    first = subprocess.Popen(["bash", "run_all.sh", "--profile", "smoke"], cwd=repo, env=env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log = repo / "results" / "smoke" / "logs" / "00_sleep.log"
        deadline = time.monotonic() + 60
        while not (log.exists() and "sleeping" in log.read_text()):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the sleeping notebook did not start"
            time.sleep(0.2)
        assert [p.name for p in executed.glob(".00_sleep.running.*.ipynb")]  # papermill's own file
        second = run_all(repo, "--profile", "smoke")
        assert second.returncode == 3
        assert "another run (run_all.sh or plugin-repro run) is already running for profile 'smoke'" in second.stderr
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 143 and "[run] interrupted by SIGTERM:" in err
    assert sorted(p.name for p in executed.iterdir()) == []  # no executed notebook, no stamp, no temp
    assert not (repo / "results" / "smoke" / "REPORT.md").exists()
    assert not StoreLock(repo / "results" / "smoke" / ".run_all.lock").busy()  # released


@pytest.mark.parametrize("edit, said", [
    (("seeds: [0]", "seeds: [zero]"), "run_all.sh: Profile field(s) wrong: smoke.seeds.0: Input should be a valid integer"),
    (("seeds: [0]", "seeds: [0"), "run_all.sh: plugin_lib/harness/profiles.yaml, line "),
], ids=["a wrong value", "a YAML syntax error"])
def test_a_bad_profiles_yaml_is_one_line_and_status_2(tmp_path, edit, said):
    """Issue 76: a wrong value ended run, preflight and grid plan in a 21-line traceback, a YAML
    syntax error in 64 lines."""
    repo = make_repo(tmp_path, {"00_ok": OK})
    settings = repo / "plugin_lib" / "harness" / "profiles.yaml"
    text = settings.read_text()
    smoke = text.index("\n  smoke:\n")
    settings.write_text(text[:smoke] + text[smoke:].replace(*edit, 1))
    result = run_all(repo, "--profile", "smoke")
    assert result.returncode == 2 and result.stderr.strip().startswith(said), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (repo / "results" / "smoke").exists()


# -- where results go, which code runs ----------------------------------------------------------

def test_plugin_results_dir_is_honoured(tmp_path):
    repo = make_repo(tmp_path, {"00_ok": OK})
    elsewhere = tmp_path / "elsewhere"
    result = run_all(repo, "--profile", "smoke", PLUGIN_RESULTS_DIR=str(elsewhere))
    assert result.returncode == 0, result.stdout + result.stderr
    smoke = elsewhere / "smoke"
    for rel in ("executed/00_ok.ipynb", "executed/00_ok.done", "executed/00_ok.seconds",
                "logs/00_ok.log", "marker.txt", "REPORT.md"):
        assert (smoke / rel).exists(), rel
    assert not (repo / "results" / "smoke").exists()
    assert git(repo, "status", "--porcelain", "--ignored") == ""


@pytest.mark.parametrize("variable, under, message", [
    ("PLUGIN_RESULTS_DIR", "results", "cannot write the results folder {}/results/smoke (Not a directory): set "
                                      "PLUGIN_RESULTS_DIR to a writable folder; nothing was run."),
    # An unwritable HOME: the cache folder is the cause, and PLUGIN_CACHE_DIR the fix.
    ("HOME", "home", "the cache folder {}/home/.cache/plugin-repro cannot be created (Not a directory): set "
                     "PLUGIN_CACHE_DIR to a writable folder with room for the base outputs."),
])
def test_an_unwritable_results_or_cache_folder_is_one_line(tmp_path, variable, under, message):
    repo = make_repo(tmp_path, {"00_ok": OK})
    (tmp_path / "a-file").write_text("")
    result = run_all(repo, "--profile", "smoke", **{variable: str(tmp_path / "a-file" / under)})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "run_all.sh: " + message.format(tmp_path / "a-file")


def test_what_killed_writers_left_is_removed_and_resumable_state_kept(tmp_path):
    """A kill -9 skips a writer's cleanup: its temporaries (named after it) go at the next call;
    a BDPL search's resumable .partial (no owner in its name) and a live writer's stay."""
    from plugin_lib.utils.locks import host_name

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = f"{host_name()}~{child.pid}"
    repo = make_repo(tmp_path, {"00_ok": OK})
    smoke, cache = repo / "results" / "smoke", tmp_path / "cache"
    orphans = [smoke / "tables" / f".table1.csv.{dead}.x1.tmp", cache / "outputs" / f".base-ab.npy.{dead}.x2.partial",
               smoke / "runs" / "e2e" / f".mine.{dead}.partial.tmp" / "reweighter.safetensors"]
    kept = [smoke / "runs" / "e2e" / "bdpl-prompts" / ".Plugin-seed0.json.partial",
            smoke / "tables" / f".table2.csv.{host_name()}~{os.getpid()}.x3.tmp"]
    for path in orphans + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 64)
    result = run_all(repo, "--profile", "smoke", PLUGIN_CACHE_DIR=str(cache))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "removed 3 temporary file(s) that killed writers left" in result.stdout
    assert not any(path.exists() for path in orphans) and not orphans[2].parent.exists()
    assert all(path.exists() for path in kept)


# -- the data and disk checks on the fake checkout; the committed local results -----------------


def test_a_failing_data_check_writes_nothing(idle_repo):
    result = run_all(idle_repo, "--profile", "local", "--force", FAKE_DATA_CHECK="fail")
    assert result.returncode == 1
    assert "Missing e2e_cleaned/test-fixed.csv" in result.stderr and "nothing was run" in result.stderr
    assert git(idle_repo, "status", "--porcelain", "--ignored") == ""


def test_other_profiles_run_no_preflight_but_check_the_disk_first(finished):
    repo, result = finished
    assert "preflight" not in result.stdout
    assert result.stdout.index("Disk: fine for 00_ok") < result.stdout.index("00_ok: running")


def test_readme_only_changes_with_a_complete_local_run(tmp_path):
    repo = make_repo(tmp_path, {"00_ok": OK})
    readme = (repo / "README.md").read_text()
    partial = run_all(repo, "--profile", "local", "--only", "00")
    assert partial.returncode == 0, partial.stdout + partial.stderr
    assert (repo / "README.md").read_text() == readme
    changed = git(repo, "status", "--porcelain").split("\n")
    assert " M README.md" not in changed
    complete = run_all(repo, "--profile", "local")  # every notebook (here: one, already finished)
    assert complete.returncode == 0, complete.stdout + complete.stderr
    assert "already finished, skipped" in complete.stdout
    assert "README.md" in complete.stdout  # the report step refreshed the README's results block
