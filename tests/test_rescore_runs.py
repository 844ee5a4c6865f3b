"""scripts/rescore_runs.py: the NIST entry of stored run records recomputed from their
predictions, on copies of committed local records; nothing else in a record changes."""
from __future__ import annotations

import functools
import importlib.util
import json

import pytest

from plugin_lib.harness import tasks
from plugin_lib.harness.profile import REPO_ROOT, load_profile
from plugin_lib.metrics import compute_metrics
from plugin_lib.metrics.mteval import corpus_nist_per_input_average
from plugin_lib.utils.io import atomic_write_json, read_json

import real_data

RECORDS = ("e2e/smollm2-135m-instruct/Zeroshot-seed0.json", "e2e/smollm2-135m-instruct/Plugin-seed1.json",
           "webnlg/smollm2-135m-instruct/Plugin-seed0.json")


@functools.cache
def _test_references(dataset: str) -> list[list[str]]:
    """The references of the local profile's test inputs, as the runner loads them."""
    return [list(ex.references) for ex in tasks.task_splits(dataset, load_profile("local"))[2]]


def _script():
    spec = importlib.util.spec_from_file_location("rescore_runs", REPO_ROOT / "scripts" / "rescore_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def runs(tmp_path):
    """Copies of committed local records whose NIST is set to the old per-input-average
    definition (as records made before the fix hold), plus a selection record."""
    real_data.require()  # the script reads the real test references
    source = REPO_ROOT / "results" / "local" / "runs"
    for name in RECORDS + ("e2e/smollm2-135m-instruct/Plugin-selection.json",):
        record = read_json(source / name)
        if "predictions" in record:
            old = corpus_nist_per_input_average(record["predictions"], _test_references(record["dataset"]))
            record = {**record, "metrics": {**record["metrics"], "NIST": old}}
        atomic_write_json(tmp_path / "runs" / name, record)
    return tmp_path / "runs"


def test_rescore_changes_nist_only(runs, capsys):
    before = {name: (runs / name).read_text(encoding="utf-8") for name in RECORDS}
    selection = (runs / "e2e/smollm2-135m-instruct/Plugin-selection.json").read_bytes()
    assert _script().main(["--profile", "local", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "3 run records rescored, changed 3" in out
    for name in RECORDS:
        old, new = json.loads(before[name]), read_json(runs / name)
        expected = compute_metrics(old["predictions"], _test_references(old["dataset"]), metrics=("NIST",))
        assert new["metrics"]["NIST"] == expected["NIST"] != old["metrics"]["NIST"]
        assert f"{runs / name}: NIST {old['metrics']['NIST']} -> {expected['NIST']}" in out
        assert {**new, "metrics": {**new["metrics"], "NIST": None}} == {**old, "metrics": {**old["metrics"], "NIST": None}}
        changed = [(a, b) for a, b in zip(before[name].splitlines(), (runs / name).read_text().splitlines()) if a != b]
        assert len(changed) == 1 and changed[0][0].strip().startswith('"NIST"')
    assert (runs / "e2e/smollm2-135m-instruct/Plugin-selection.json").read_bytes() == selection
    # A second run finds nothing to change.
    assert _script().main(["--profile", "local", "--runs-dir", str(runs)]) == 0
    assert "changed 0" in capsys.readouterr().out


def test_dry_run_writes_nothing(runs, capsys):
    snapshot = {p: p.read_bytes() for p in runs.rglob("*.json")}
    assert _script().main(["--profile", "local", "--runs-dir", str(runs), "--dry-run"]) == 0
    assert "would change 3" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in runs.rglob("*.json")} == snapshot


@pytest.mark.parametrize("change, message", [
    (lambda r: {**r, "test_ids": r["test_ids"][::-1]}, "test ids differ"),
    (lambda r: {**r, "inputs": "0123456789abcdef"}, "made from other data"),
])
def test_refuses_records_of_other_inputs_and_writes_nothing(runs, capsys, change, message):
    path = runs / RECORDS[-1]
    atomic_write_json(path, change(read_json(path)))
    snapshot = {p: p.read_bytes() for p in runs.rglob("*.json")}
    assert _script().main(["--profile", "local", "--runs-dir", str(runs)]) == 2
    assert message in capsys.readouterr().err
    assert {p: p.read_bytes() for p in runs.rglob("*.json")} == snapshot


def test_refuses_a_file_it_would_reformat(runs, capsys):
    path = runs / RECORDS[0]
    path.write_text(json.dumps(read_json(path)), encoding="utf-8")  # one line, not atomic_write_json's form
    assert _script().main(["--profile", "local", "--runs-dir", str(runs)]) == 2
    assert "rewriting it would change more than NIST" in capsys.readouterr().err
