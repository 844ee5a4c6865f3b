"""Stored run records are verified by content (issue 61): the store writes each record's hash
into ``RECORDS.sha256`` beside ``runs/`` (plugin_lib/utils/record_manifest.py), and
commands/stamp.py, which plugin-repro run calls before any notebook, checks every record against it.
An edited number (still valid JSON) stops it with exit 5, a truncated record with 4 (not
run_all.sh's 3, another run holding the profile), a record the store did not write with 6, each
naming the file and its mend; an untouched store passes. A record whose metrics its own
predictions do not give (an edit that re-hashed its manifest line) stops it with 5 too. The stores
are temporary; the tests that score real predictions declare the data they read."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from plugin_lib.utils import record_manifest
from plugin_lib.utils.record_manifest import MANIFEST, write_record
import real_data
from fake_checkout import OK, ROOT, git, make_repo, notebook, run_all, run_stamp

RECORD = {"dataset": "e2e", "method": "Plugin", "seed": 0, "metrics": {"BLEU": 0.3141, "ROUGE-L": 0.5}}


def manifest(store) -> dict[str, str]:
    return record_manifest.read_manifest(store)


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A smoke store under PLUGIN_RESULTS_DIR with two records written by the store, and a notebook."""
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "results"))
    root = tmp_path / "results" / "smoke"
    runs = root / "runs" / "e2e" / "base"
    write_record(runs / "Plugin-seed0.json", RECORD)
    write_record(runs / "Zeroshot-seed0.json", {**RECORD, "method": "Zeroshot"})
    (tmp_path / "00_x.ipynb").write_text(notebook("print(1)"))
    return root


def stamp(tmp_path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The stamps' record check (commands/stamp.py), on the temporary store."""
    return subprocess.run([sys.executable, "-m", "plugin_lib.commands.stamp", "--profile", "smoke", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PLUGIN_RESULTS_DIR": str(tmp_path / "results"), **(env or {})})


def test_the_store_lists_each_record_it_writes_and_nothing_else(tmp_path):
    root = tmp_path / "smoke"
    runs = root / "runs" / "e2e" / "base"
    first = write_record(runs / "Plugin-seed0.json", RECORD)
    assert manifest(root) == {"runs/e2e/base/Plugin-seed0.json": sha(first)}
    line = (root / MANIFEST).read_text()
    assert line == f"{sha(first)}  runs/e2e/base/Plugin-seed0.json\n"  # sha256sum's format
    assert subprocess.run(["sha256sum", "-c", "--quiet", MANIFEST], cwd=root).returncode == 0
    second = write_record(runs / "bdpl-prompts" / "seed0.json", {"prefix": ""})
    write_record(first, {**RECORD, "seed": 1})  # rewritten by the store: its new hash
    assert manifest(root) == {"runs/e2e/base/Plugin-seed0.json": sha(first),
                              "runs/e2e/base/bdpl-prompts/seed0.json": sha(second)}
    second.unlink()  # deleted so that it is recomputed: the next write drops it
    write_record(runs / "Zeroshot-seed0.json", RECORD)
    assert sorted(manifest(root)) == ["runs/e2e/base/Plugin-seed0.json", "runs/e2e/base/Zeroshot-seed0.json"]
    # Not records: a temporary, a cache, a lock, a table, a file directly in runs/<dataset>.
    for other in (runs / ".Plugin-seed2.json", runs / "cache" / "rows.json", runs / ".locks" / "x.json",
                  root / "tables" / "main.json", root / "runs" / "e2e" / "x.json"):
        write_record(other, {})
    assert sorted(manifest(root)) == ["runs/e2e/base/Plugin-seed0.json", "runs/e2e/base/Zeroshot-seed0.json"]
    assert not (tmp_path / MANIFEST).exists() and not (root / "tables" / MANIFEST).exists()
    assert record_manifest.verify(root) == ([], [])


def test_a_store_from_before_the_manifest_is_adopted_by_its_next_write(tmp_path):
    runs = tmp_path / "smoke" / "runs" / "e2e" / "base"
    runs.mkdir(parents=True)
    (runs / "Plugin-seed0.json").write_text(json.dumps(RECORD))
    assert record_manifest.verify(tmp_path / "smoke") is None  # no manifest: nothing to compare with
    write_record(runs / "Plugin-seed1.json", RECORD)
    assert sorted(manifest(tmp_path / "smoke")) == ["runs/e2e/base/Plugin-seed0.json", "runs/e2e/base/Plugin-seed1.json"]


def test_an_untouched_store_passes(store, tmp_path):
    result = stamp(tmp_path, str(tmp_path / "00_x.ipynb"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("00_x.ipynb\n") and result.stderr == ""


def test_check_reads_the_stamps_where_the_results_are_and_tells_unrun_from_stale(store, tmp_path):
    """With PLUGIN_RESULTS_DIR set, run_all.sh stamps there; `stamp --check` read the checkout's results/."""
    notebook_file = str(tmp_path / "00_x.ipynb")
    made = stamp(tmp_path, notebook_file)
    assert made.returncode == 0, made.stderr
    unrun = stamp(tmp_path, "--check", notebook_file)
    assert unrun.returncode == 1 and unrun.stderr.startswith(f"{store} holds no execution of 1 notebook(s): 00_x.")
    (store / "executed").mkdir()
    (store / "executed" / "00_x.done").write_text(made.stdout.split()[0] + "\n")
    current = stamp(tmp_path, "--check", notebook_file)
    assert (current.returncode, current.stderr) == (0, "")
    (store / "executed" / "00_x.done").write_text("0" * 64 + "\n")
    stale = stamp(tmp_path, "--check", notebook_file)
    assert stale.returncode == 1 and stale.stderr.startswith(f"{store} is stale for 1 notebook(s): 00_x. Their code")


def test_an_edited_number_is_caught_naming_the_file_with_its_own_status(store, tmp_path):
    record = store / "runs" / "e2e" / "base" / "Plugin-seed0.json"
    text = record.read_text()
    record.write_text(text.replace('"BLEU": 0.3141', '"BLEU": 0.9'))  # still valid JSON
    assert json.loads(record.read_text())["metrics"]["BLEU"] == 0.9
    for args in ([], ["--check"]):
        result = stamp(tmp_path, *args, str(tmp_path / "00_x.ipynb"))
        assert result.returncode == 5, result.stderr
        assert result.stdout == ""  # no stamp: run_all.sh runs nothing
        (line,) = result.stderr.splitlines()
        assert str(record) in line and MANIFEST in line and "Zeroshot" not in line
        assert f"delete {record}: the next run recomputes them" in line
    record.unlink()  # the mend: a listed record that is gone is recomputed, not a fault
    assert stamp(tmp_path, str(tmp_path / "00_x.ipynb")).returncode == 0


def test_a_truncated_record_is_damaged_not_a_held_profile(store, tmp_path):
    record = store / "runs" / "e2e" / "base" / "Zeroshot-seed0.json"
    record.write_bytes(record.read_bytes()[:40])
    result = stamp(tmp_path, str(tmp_path / "00_x.ipynb"))
    assert result.returncode == 4 and result.returncode != 3, result.stderr
    (line,) = result.stderr.splitlines()  # damaged, and not reported a second time as edited
    assert "cannot be read" in line and str(record) in line and "recomputes" in line


def test_a_record_the_store_did_not_write_stops_until_it_is_listed(store, tmp_path):
    stranger = store / "runs" / "e2e" / "base" / "ICL-1-seed0.json"
    stranger.write_text(json.dumps(RECORD))
    result = stamp(tmp_path, str(tmp_path / "00_x.ipynb"))
    assert result.returncode == 6 and str(stranger) in result.stderr and "--write-manifest" in result.stderr
    listed = stamp(tmp_path, "--write-manifest")
    assert listed.returncode == 0, listed.stderr
    assert manifest(store)["runs/e2e/base/ICL-1-seed0.json"] == sha(stranger)
    assert stamp(tmp_path, str(tmp_path / "00_x.ipynb")).returncode == 0
    # --write-manifest lists new records only: it never takes an edited one's content as its hash.
    stranger.write_text(json.dumps({**RECORD, "seed": 7}))
    refused = stamp(tmp_path, "--write-manifest")
    assert refused.returncode == 5 and manifest(store)["runs/e2e/base/ICL-1-seed0.json"] != sha(stranger)


def test_a_damaged_manifest_is_named(store, tmp_path):
    (store / MANIFEST).write_text("<<<<<<< HEAD\n")
    result = stamp(tmp_path, str(tmp_path / "00_x.ipynb"))
    assert result.returncode == 4 and str(store / MANIFEST) in result.stderr


def test_concurrent_writers_each_list_their_record(tmp_path):
    """The manifest is read, changed and replaced under the store's lock: processes writing at
    once lose none of each other's entries."""
    code = ("import sys; from pathlib import Path; from plugin_lib.utils.record_manifest import write_record\n"
            "for i in range(8): write_record(Path(sys.argv[1]) / f'M{sys.argv[2]}-seed{i}.json', {'i': i})\n")
    runs = tmp_path / "smoke" / "runs" / "e2e" / "base"
    workers = [subprocess.Popen([sys.executable, "-c", code, str(runs), str(k)], cwd=ROOT) for k in range(3)]
    assert [w.wait(timeout=120) for w in workers] == [0, 0, 0]
    assert len(manifest(tmp_path / "smoke")) == 24
    assert record_manifest.verify(tmp_path / "smoke") == ([], [])


@pytest.mark.parametrize("profile, names", [("local", {"local", "api"}), ("confirm", {"confirm", "api"}),
                                            ("wave3", {"wave3"}), ("wave4", {"wave4"})])
def test_the_committed_records_match_their_manifest(profile, names):
    """results/local's, results/confirm's, results/wave3's and results/wave4's manifests list exactly their
    committed records, with their content's hash."""
    local = ROOT / "results" / profile
    if not local.exists():
        pytest.skip(f"results/{profile} holds no records yet")
    committed = set(git(ROOT, "ls-files", f"results/{profile}").splitlines())
    for store in record_manifest.stores(local):
        prefix = store.relative_to(ROOT).as_posix() + "/"
        assert f"{prefix}{MANIFEST}" in committed
        assert sorted(prefix + name for name in manifest(store)) == sorted(
            p for p in committed if p.startswith(prefix + "runs/") and record_manifest.is_record(
                tuple(p[len(prefix):].split("/"))))
        assert record_manifest.verify(store) == ([], []), store
    assert {s.name for s in record_manifest.stores(local)} == names


@pytest.mark.parametrize("profile", ["local", "wave3", "wave4"])
def test_the_committed_records_metrics_are_what_their_predictions_score(profile):
    """Every committed record of the profile scored again (``harness.running.record_scores``). `confirm`'s
    294 records (about a second each: docs/architecture.md) are checked by `plugin-repro stamp --check
    --profile confirm`."""
    real_data.require()
    from plugin_lib.harness.running import record_scores

    paths = [store / name for store in record_manifest.stores(ROOT / "results" / profile)
             for name in record_manifest.records(store)]
    assert [m.line() for m in record_scores.mismatches(paths)] == []


def test_an_edited_committed_record_is_mended_from_git():
    local = ROOT / "results" / "local"
    # An edit to one of them is mended from git, whose copy has the listed hash.
    edited = local / "runs" / "e2e" / "smollm2-135m-instruct" / "Plugin-seed0.json"
    assert run_stamp().mend_advice([edited], listed=True) == (
        "restore the committed record(s) with `git checkout -- results/local/runs/e2e/smollm2-135m-instruct/Plugin-seed0.json`")


@pytest.fixture
def scored_store(tmp_path, monkeypatch):
    """A smoke store holding one real record: e2e test inputs, predictions (other inputs'
    references) and the seven metrics compute_metrics gives them."""
    real_data.require("e2e")
    from plugin_lib.data import load_dataset
    from plugin_lib.metrics import compute_metrics

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("PLUGIN_CACHE_DIR", str(tmp_path / "cache"))
    test = load_dataset("e2e", "test")[:12]
    predictions = [ex.references[0] for ex in test[1:] + test[:1]]
    record = {**RECORD, "test_ids": [ex.id for ex in test], "predictions": predictions,
              "metrics": compute_metrics(predictions, [list(ex.references) for ex in test])}
    path = write_record(tmp_path / "results" / "smoke" / "runs" / "e2e" / "base" / "Plugin-seed0.json", record)
    (tmp_path / "00_x.ipynb").write_text(notebook("print(1)"))
    return path


def test_metrics_that_the_records_own_predictions_do_not_give_stop_the_check(scored_store, tmp_path):
    """Issue 76's probe: a BLEU set to 0.9 with its manifest line re-hashed passed every check."""
    env = {"PLUGIN_CACHE_DIR": str(tmp_path / "cache")}
    assert stamp(tmp_path, "--check", str(tmp_path / "00_x.ipynb"), env=env).returncode == 1  # fine: only unstamped
    assert list((tmp_path / "cache" / "verified-records").iterdir())  # remembered as true
    record = json.loads(scored_store.read_text())
    record["metrics"]["BLEU"] = 0.9
    record["metrics"]["a key of its own"] = 1.0  # does not exempt the record
    write_record(scored_store, record)  # re-hashes its manifest line: the manifest now agrees
    assert record_manifest.verify(scored_store.parents[3]) == ([], [])
    caught = stamp(tmp_path, "--check", str(tmp_path / "00_x.ipynb"), env=env)
    assert caught.returncode == 5, caught.stderr
    assert f"{scored_store}: metrics.BLEU is 0.9, its predictions score 0." in caught.stderr
    assert "delete" in caught.stderr and len(caught.stderr.strip().splitlines()) == 1


def test_run_all_stops_on_an_edited_or_a_truncated_record_with_their_own_statuses(tmp_path):
    """The user's report: an edited BLEU passed run_all.sh, and a truncated record exited 3."""
    repo = make_repo(tmp_path, {"00_ok": OK})
    record = repo / "results" / "smoke" / "runs" / "e2e" / "base" / "Plugin-seed0.json"
    write_record(record, RECORD)
    assert run_all(repo, "--profile", "smoke").returncode == 0
    record.write_text(record.read_text().replace('"BLEU": 0.3141', '"BLEU": 0.9'))
    edited = run_all(repo, "--profile", "smoke", "--force", "--only", "00")
    assert edited.returncode == 5, edited.stdout + edited.stderr
    assert "results/smoke/runs/e2e/base/Plugin-seed0.json" in edited.stderr and "00_ok: running" not in edited.stdout
    record.write_text('{"dataset": "e2e", "metr')
    truncated = run_all(repo, "--profile", "smoke")
    assert truncated.returncode == 4, truncated.stdout + truncated.stderr
    assert "results/smoke/runs/e2e/base/Plugin-seed0.json" in truncated.stderr
