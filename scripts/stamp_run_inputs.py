"""Add the ``inputs`` field to a profile's stored run records made before runs were keyed on it.

    python scripts/stamp_run_inputs.py --profile local [--dry-run]

A record counts as current only when its ``settings`` and its ``inputs`` (a hash of the task's
examples and base model, ``harness.running.run_keys.inputs_fingerprint``) match; one without ``inputs``
is stale and would be made again. This script certifies older records instead, but only after
checking that they were made from the data there is now:

1. every data file the profile's datasets read matches the shipped checksums
   (``plugin_lib.data.integrity``);
2. each run record's ``test_ids`` equal the current task's test ids, and its ``scale`` (train,
   hyper-validation, test inputs) the current splits'; each BDPL prompt record's
   ``train_inputs`` the current training part's size; a grid-search record
   (``*-selection.json``) is stamped only beside run records of its folder that pass.

If any check fails it writes nothing and exits 2, saying which record or file. Records that
already carry the current ``inputs`` are left as they are; one with other ``inputs`` is refused.
The ``settings`` hash is never touched. Needs no model: the fingerprint comes from the examples
and the base model's registry entry.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from plugin_lib.data import data_dir, integrity
from plugin_lib.harness import tasks
from plugin_lib.harness.running import run_keys
from plugin_lib.harness.machine import results_dir
from plugin_lib.harness.profile import load_profile
from plugin_lib.utils.io import read_json
from plugin_lib.utils.record_manifest import write_record


class Refused(Exception):
    pass


def splits_for(dataset: str, profile, cache: dict):
    if dataset not in cache:
        cache[dataset] = tasks.task_splits(dataset, profile)
    return cache[dataset]


def plan(profile_name: str) -> list[tuple[Path, dict, str]]:
    """(path, record, inputs) for every record to stamp; Refused on any mismatch."""
    profile = load_profile(profile_name)
    root = results_dir(profile) / "runs"
    records = sorted(root.rglob("*.json"))
    if not records:
        raise Refused(f"No run records under {root}.")
    datasets = sorted({p.relative_to(root).parts[0] for p in records})
    folder = data_dir()
    if folder is None:
        raise Refused("PLUGIN_DATA_DIR=hub: the records can only be checked against local data files.")
    problems, _ = integrity.check(folder, [d for d in datasets if d in integrity.sources.GROUPS])
    if problems:
        raise Refused("The data does not match the shipped checksums:\n  - "
                      + "\n  - ".join(p.message for p in problems))

    cache: dict = {}
    todo, checked_folders, selections = [], defaultdict(list), []
    for path in records:
        record = read_json(path)
        dataset = path.relative_to(root).parts[0]
        train, hyper, test = splits_for(dataset, profile, cache)
        if path.parent.name == "bdpl-prompts":
            if record.get("train_inputs") != len(train):
                raise Refused(f"{path}: learned on {record.get('train_inputs')} training inputs, the current "
                              f"task has {len(train)}.")
            model = record["model"]
        elif path.name.endswith("-selection.json"):
            selections.append(path)
            continue
        else:
            ids = [e.id for e in test]
            if record.get("test_ids") != ids:
                raise Refused(f"{path}: its test ids differ from the current task's ({len(record.get('test_ids') or [])} "
                              f"stored, {len(ids)} now).")
            scale = record.get("scale", {})
            now = {"train_inputs": len(train), "hyper_inputs": len(hyper), "test_inputs": len(test)}
            if any(scale.get(k) != v for k, v in now.items()):
                raise Refused(f"{path}: made at scale {scale}, the current task has {now}.")
            model = record["model"]
            checked_folders[path.parent].append(model)
        todo.append((path, record, run_keys.examples_fingerprint(model, train, hyper, test)))
    for path in selections:
        models = set(checked_folders.get(path.parent, ()))
        if len(models) != 1:
            raise Refused(f"{path}: no checked run record beside it names its model ({sorted(models)}).")
        record = read_json(path)
        dataset = path.relative_to(root).parts[0]
        todo.append((path, record, run_keys.examples_fingerprint(models.pop(), *splits_for(dataset, profile, cache))))
    for path, record, inputs in todo:
        if "inputs" in record and record["inputs"] != inputs:
            raise Refused(f"{path}: already stamped with other inputs ({record['inputs']}, now {inputs}).")
    return todo


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True)
    parser.add_argument("--dry-run", action="store_true", help="check only; write nothing")
    args = parser.parse_args(argv)
    try:
        todo = plan(args.profile)
    except Refused as err:
        print(f"[stamp] refused, nothing written: {err}", file=sys.stderr)
        return 2
    new = [(p, r, i) for p, r, i in todo if r.get("inputs") != i]
    print(f"[stamp] {len(todo)} records checked; {len(new)} to stamp, {len(todo) - len(new)} already current")
    if not args.dry_run:
        for path, record, inputs in new:
            write_record(path, {**record, "inputs": inputs})
        print(f"[stamp] wrote {len(new)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
