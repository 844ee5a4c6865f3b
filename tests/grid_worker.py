"""One executor process of the grid's fault tests (tests/test_grid.py): runs the mini grid
(:func:`mini_units`) with the local executor in the run store that PLUGIN_RESULTS_DIR names.

    python tests/grid_worker.py LOG [SLEEP_S]

Every computation of a unit appends ``compute <key> <pid>`` to LOG before it and ``end <key>
<pid>`` after it (O_APPEND: whole lines from many processes); with SLEEP_S, the first training
of a configuration waits that long between the two, so that a test can kill the process in the
middle of a unit.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from plugin_lib.core.cache import BaseOutputCache
from plugin_lib.harness import grid, load_profile, methods
from plugin_lib.harness.running import run_keys, runner

METHODS = ["Zeroshot", "Plugin", "TempNet-greedy"]
TIMING = {"seconds", "provenance"}  # fields that differ between two computations of one record (time, where, which tree)


def without_timing(value):
    """A record with its timing fields removed, at every depth."""
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def mini_profile():
    """The smoke profile on fewer rows and tokens: every kind of unit in about a minute."""
    smoke = load_profile("smoke")
    return smoke.replace(rows={"train": 8, "validation": 8, "test": 4},
                         decoding={**smoke.section("decoding"), "max_new_tokens": 8})


def mini_units():
    """A base-output cache, a configuration, a selection and three runs (TempNet-greedy reads Zeroshot)."""
    return grid.table_units("e2e", mini_profile(), "01", method_names=METHODS)


def main(log: str, sleep_s: float = 0.0) -> None:
    def note(line: str) -> None:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, f"{line} {os.getpid()}\n".encode())
        os.close(fd)

    build, compute_run, train = BaseOutputCache.build.__func__, runner._compute_run, methods.train

    def logged_build(cls, base, pairs, *, directory=None, **kwargs):
        path = BaseOutputCache.stored_path(directory, base.name, pairs) if directory is not None else None
        fresh = path is not None and not path.exists()
        if fresh:
            note(f"compute {path.name}")
        cache = build(cls, base, pairs, directory=directory, **kwargs)
        if fresh:
            note(f"end {path.name}")
        return cache

    def logged_run(task, method, label, seed, *args, **kwargs):
        note(f"compute {label}-seed{seed}")
        record = compute_run(task, method, label, seed, *args, **kwargs)
        note(f"end {label}-seed{seed}")
        return record

    def logged_train(task, spec, **kwargs):
        tag = f"{spec.method}-{run_keys.config_tag(spec.hparams)}"
        note(f"compute {tag}")
        result = train(task, spec, **kwargs)
        if sleep_s:
            time.sleep(sleep_s)
        note(f"end {tag}")
        return result

    BaseOutputCache.build = classmethod(logged_build)
    runner._compute_run = logged_run
    methods.train = logged_train
    plan = grid.make_plan(mini_units(), measure=False)
    grid.run_local(plan, progress=False)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
