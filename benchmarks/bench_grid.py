"""The grid serial against Ray on this machine, and the plan's projection for ``paper``; every
ratio comes from this run.

    python benchmarks/bench_grid.py [--only 01] [--workers 2] [--projection-only]

1. The smoke profile's units of the notebooks ``--only`` names (default: notebook 01), computed
   twice from empty run stores: one after another in this process (the local executor), then as
   Ray tasks on a local cluster of ``--workers`` CPUs (one thread each). Prints both wall times,
   their ratio, and whether the records are the same apart from timing fields.
2. The plan of the ``paper`` profile (every notebook with units whose data are here): units, device-hours, critical
   path and wall time on 1, 8 and 32 GPUs, at the rates the plan has here (on a machine without a
   GPU: the H100 probe's, cache building and training only; on a GPU: measured).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from plugin_lib.harness import grid, load_profile
from plugin_lib.commands import studies


def _records(store: Path) -> dict:
    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k != "seconds"}
        return [clean(v) for v in value] if isinstance(value, list) else value

    return {str(p.relative_to(store)): clean(json.loads(p.read_text())) for p in store.rglob("*.json")
            if "-seed" in p.name or p.name.endswith("-selection.json")}


def _timed_run(units, store: Path, executor: str, workers: int) -> float:
    os.environ["PLUGIN_RESULTS_DIR"] = str(store)
    plan = grid.make_plan(units, measure=False)
    started = time.perf_counter()
    if executor == "local":
        grid.run_local(plan)
    else:
        grid.run_ray(plan, num_cpus=workers, num_gpus=0)
    seconds = time.perf_counter() - started
    grid.refresh(plan)
    assert not plan.pending(), "units left pending"
    return seconds


def serial_against_ray(only: list[str], workers: int) -> None:
    smoke = load_profile("smoke")
    units = studies.units(smoke, only)
    with tempfile.TemporaryDirectory() as serial, tempfile.TemporaryDirectory() as parallel:
        local_s = _timed_run(units, Path(serial), "local", workers)
        ray_s = _timed_run(units, Path(parallel), "ray", workers)
        same = _records(Path(serial)) == _records(Path(parallel))
    print(f"\nsmoke, notebooks {' '.join(only)}: {len(units)} units; serial {local_s:.0f} s, Ray with {workers} "
          f"workers {ray_s:.0f} s (ray.init and worker start-up included): {local_s / ray_s:.2f}x; records equal "
          f"apart from timing fields: {same}")


def paper_projection() -> None:
    paper = load_profile("paper")
    started = time.perf_counter()
    problems: dict[str, str] = {}
    plan = grid.make_plan(studies.units(paper, problems=problems), measure=True)
    for notebook, problem in problems.items():
        print(f"  {notebook}: {problem}")
    pending = plan.pending()
    hours = sum(plan.seconds.get(u.key, 0.0) for u in pending) / 3600
    critical, chain = plan.critical_path()
    print(f"\npaper: {len(plan.units)} units ({len(pending)} pending), {hours:,.1f} device-hours; critical path "
          f"{critical / 3600:,.2f} h over {len(chain)} units; times: {plan.timed} (planned in "
          f"{time.perf_counter() - started:.0f} s)")
    bound = {gpus: plan.wall_seconds(gpus) / 3600 for gpus in (1, 8, 32)}
    # The same plan if no choice sits at a grid edge: the selections then train nothing more.
    for unit in pending:
        if unit.kind == "selection":
            plan.seconds[unit.key] = 0.0
    listed = {gpus: plan.wall_seconds(gpus) / 3600 for gpus in (1, 8, 32)}
    print("  GPUs  wall h (every edge pushed)  speed-up  wall h (no edge pushed)  speed-up")
    for gpus in (1, 8, 32):
        print(f"  {gpus:>4}  {bound[gpus]:>26,.1f}  {bound[1] / bound[gpus]:>7.1f}x  {listed[gpus]:>23,.1f}  "
              f"{listed[1] / listed[gpus]:>7.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=["01"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--projection-only", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not args.projection_only:
        serial_against_ray(args.only, args.workers)
    paper_projection()


if __name__ == "__main__":
    main()
