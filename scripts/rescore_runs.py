"""Recompute the NIST entry of a profile's stored run records from their stored predictions.

    python scripts/rescore_runs.py --profile local [--dry-run] [--runs-dir PATH]

For records scored before NIST followed the official E2E scorer's definition
(``metrics.mteval.corpus_nist``: the brevity penalty's reference length from the pooled mean
length of all references, not the per-input average). Every ``*-seed<k>.json`` under
``results/<profile>/runs/`` (or ``--runs-dir``) that holds ``predictions`` is rescored against
the references of its task's test inputs, loaded as the runner loads them
(``harness.tasks.task_splits`` at the profile's scale). Only ``metrics["NIST"]`` changes; the
record's ``settings`` and ``inputs`` stay, so it stays current and is not made again.

Checks first, and writes nothing (exit 2) if any fails:

1. the record's ``test_ids`` equal the current task's test ids, and its ``inputs`` the
   fingerprint of the current task's data (``harness.running.run_keys.examples_fingerprint``), so the
   references are those the run was scored against;
2. the file is exactly what ``utils.io.atomic_write_json`` writes for the record it holds, so
   rewriting it changes the NIST line and nothing else.

Then writes each record atomically and prints "old -> new" per run. Needs no model.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from plugin_lib.harness import tasks
from plugin_lib.harness.running import run_keys
from plugin_lib.harness.machine import results_dir
from plugin_lib.harness.profile import load_profile
from plugin_lib.metrics import compute_metrics
from plugin_lib.utils.io import read_json
from plugin_lib.utils.record_manifest import write_record


class Refused(Exception):
    pass


def _as_written(record: dict) -> str:
    """The text ``atomic_write_json`` writes for ``record``."""
    return json.dumps(record, indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def plan(profile_name: str, runs_dir: Path | None = None) -> tuple[list[tuple[Path, dict, float]], int]:
    """(path, record, new NIST) for every run record with predictions, and how many records
    without predictions were skipped; Refused on any failed check."""
    profile = load_profile(profile_name)
    root = runs_dir or results_dir(profile) / "runs"
    paths = sorted(root.rglob("*-seed*.json"))
    if not paths:
        raise Refused(f"No run records under {root}.")
    splits: dict[str, tuple] = {}
    todo, skipped = [], 0
    for path in paths:
        record = read_json(path)
        if "predictions" not in record:
            skipped += 1
            continue
        if path.read_text(encoding="utf-8") != _as_written(record):
            raise Refused(f"{path}: not in the form atomic_write_json writes; rewriting it would change more than NIST.")
        dataset = record["dataset"]
        if dataset not in splits:
            splits[dataset] = tasks.task_splits(dataset, profile)
        train, hyper, test = splits[dataset]
        if record.get("test_ids") != [ex.id for ex in test]:
            raise Refused(f"{path}: its test ids differ from the current {dataset} task's "
                          f"({len(record.get('test_ids') or [])} stored, {len(test)} now).")
        if record.get("inputs") != run_keys.examples_fingerprint(record["model"], train, hyper, test):
            raise Refused(f"{path}: made from other data than the current task's (inputs {record.get('inputs')}).")
        references = [list(ex.references) for ex in test]
        nist = compute_metrics(record["predictions"], references, metrics=("NIST",))["NIST"]
        todo.append((path, record, nist))
    return todo, skipped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True)
    parser.add_argument("--runs-dir", type=Path, help="default: results/<profile>/runs")
    parser.add_argument("--dry-run", action="store_true", help="check and print; write nothing")
    args = parser.parse_args(argv)
    try:
        todo, skipped = plan(args.profile, args.runs_dir)
    except Refused as err:
        print(f"[rescore] refused, nothing written: {err}", file=sys.stderr)
        return 2
    changed = 0
    for path, record, nist in todo:
        old = record["metrics"].get("NIST")
        print(f"{path}: NIST {old} -> {nist}")
        if old != nist:
            changed += 1
            if not args.dry_run:
                write_record(path, {**record, "metrics": {**record["metrics"], "NIST": nist}})
    verb = "would change" if args.dry_run else "changed"
    print(f"[rescore] {len(todo)} run records rescored, {verb} {changed}; {skipped} without predictions skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
