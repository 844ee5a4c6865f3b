"""``plugin-repro grid plan|run --profile P [--only NB ...]``: the notebooks' units of work, their
plan, and their execution here, on Ray or on Slurm (docs/scale.md).

It lives above the layers (``plugin_lib.commands``): it collects each notebook's units from the
notebook's own module in ``plugin_lib.experiments``, and the harness's grid (plan, executors,
units) never imports upwards.
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..harness import machine
from ..harness import profile as config
from ..harness.grid import EXECUTORS

if TYPE_CHECKING:
    from ..harness.grid import plan as planning, units as grid_units
    from ..harness.profile import Profile

# The parser needs only the light modules above, so that --help and a usage error are answered
# at once; what plans and computes units (torch, every notebook's module) is imported after it.
GIB = 2**30
WAVES = (2, 3, 4)  # the preregistered waves with runs of their own


def wave(number: int) -> tuple[str, Callable[[Profile], list[grid_units.Unit]]]:
    """Wave ``number``'s profile and its units (which name the notebooks they come from)."""
    from ..experiments import confirmation
    from . import confirmation_wave2, confirmation_wave3, confirmation_wave4

    return {2: (confirmation.PROFILE, confirmation_wave2.units),
            3: ("wave3", confirmation_wave3.units),
            4: (confirmation_wave4.PROFILE, confirmation_wave4.units)}[number]


def select_units(units: Sequence[grid_units.Unit], keep: Sequence[str] = (), skip: Sequence[str] = ()
                 ) -> list[grid_units.Unit]:
    """The units whose keys match a pattern of ``keep`` (``fnmatch``; all when empty) with the
    units they need, less the units matching ``skip`` and every unit that needs one of those
    (it would compute them itself). E.g. one process on a long unit, another on the rest."""
    from ..harness.grid import plan as planning

    def matches(unit: grid_units.Unit, patterns: Sequence[str]) -> bool:
        return any(fnmatch.fnmatchcase(unit.key, p) for p in patterns)

    dropped = {u.key for u in units if matches(u, skip)}
    for unit in planning.topological(units):  # dependency order: a dropped unit's dependents follow it
        if set(unit.needs) & dropped:
            dropped.add(unit.key)
    kept = [u for u in units if u.key not in dropped]
    if keep:
        if not any(matches(u, keep) for u in units):
            raise ValueError(f"--units {' '.join(keep)} matches no unit; `plan` lists their keys.")
        wanted = [u for u in kept if matches(u, keep)]
        if not wanted:
            raise ValueError(f"--units {' '.join(keep)} --skip {' '.join(skip)} leaves no unit to run.")
        kept = planning.with_needs(kept, wanted)
    return kept


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.2f}"


def print_plan(plan: planning.Plan, profile: Profile, only: Sequence[str], *, show_units: bool,
               problems: dict[str, str] | None = None, out=None) -> None:
    from ..harness.grid import plan as planning
    from . import studies

    out = out or sys.stdout
    chosen = studies.chosen(only)
    print(f"Grid plan of profile '{profile.name}': {len(plan.units)} units from notebooks "
          f"{', '.join(s.prefix for s in chosen if s.work)}; times: {plan.timed}.", file=out)
    for model, pricing in plan.pricing.items():
        print(f"  {model}: {pricing}.", file=out)
    for study in chosen:
        if study.in_notebook or study.notebook in (problems or {}):
            print(f"  {study.notebook}: {(problems or {}).get(study.notebook) or study.in_notebook}", file=out)
    if show_units:
        print("\nunit  kind  state  needs  GPU GiB  hours<=  notebooks", file=out)
        for unit in plan.units:
            needs = ",".join(k.rsplit("/", 1)[-1] for k in unit.needs) or "-"
            print(f"{unit.key}  {unit.kind}  {plan.state.get(unit.key, '?')}  {needs}  "
                  f"{plan.gpu_bytes.get(unit.key, 0) / GIB:.1f}  {_hours(plan.seconds.get(unit.key, 0.0))}  "
                  f"{' '.join(nb[:2] for nb in unit.notebooks)}", file=out)
    likely = bool(plan.likely)
    print("\nkind  units  done  ready  waiting  hours<= (pending)" + ("  likely hours" if likely else ""), file=out)
    for kind, n, done, ready, waiting, hours, likely_hours in planning.kind_summary(plan):
        print(f"{kind}  {n}  {done}  {ready}  {waiting}  {hours:,.2f}"
              + (f"  {likely_hours:,.2f}" if likely else ""), file=out)

    def walls(seconds=None) -> str:
        return "; ".join(f"{n} GPU{'s' if n > 1 else ''} {_hours(plan.wall_seconds(n, seconds))} h" for n in (1, 8, 32))

    if any(plan.seconds.values()):
        total = sum(plan.seconds.get(u.key, 0.0) for u in plan.pending())
        critical, chain = plan.critical_path()
        same = ("decoding left out; `preflight --gpu h100` prices it too" if plan.probed
                else "the preflight's total at the same rates")
        print(f"\nAll: {len(plan.units)} units, {_hours(sum(plan.seconds.values()))} device-hours at most "
              f"({same}).", file=out)
        print(f"Pending: {len(plan.pending())} units, {_hours(total)} device-hours at most; critical path "
              f"{_hours(critical)} h over {len(chain)} units.", file=out)
        print(f"Wall time, one unit per GPU at a time: {walls()}.", file=out)
    else:  # no rates: hours of 0.00 would read as "free"
        print(f"\nAll: {len(plan.units)} units; pending: {len(plan.pending())}. Not timed, so no hours (drop "
              "--no-measure, or give --rates FILE).", file=out)
    if plan.stored:
        print(f"Done: {sum(s == 'done' for s in plan.state.values())} units; the records of {len(plan.stored)} of them "
              f"({', '.join(planning.STORED_KINDS)}) store {_hours(sum(plan.stored.values()))} process-hours "
              "(wall time, pauses included).", file=out)
    if likely:
        pending_likely = sum(plan.likely.get(u.key, 0.0) for u in plan.pending())
        print(f"Likely: {_hours(pending_likely)} device-hours; wall time {walls(plan.likely)} (at the "
              f"{plan.calibrated}; BDPL's searches at every configuration).", file=out)


def write_csv(plan: planning.Plan, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "kind", "state", "needs", "gpu_gib", "hours", "notebooks"])
        for unit in plan.units:
            writer.writerow([unit.key, unit.kind, plan.state.get(unit.key, ""), " ".join(unit.needs),
                             f"{plan.gpu_bytes.get(unit.key, 0) / GIB:.2f}", f"{plan.seconds.get(unit.key, 0.0) / 3600:.4f}",
                             " ".join(unit.notebooks)])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plugin-repro grid",
                                     description="The notebooks' units of work: plan them, or run them here, on "
                                                 "Ray or on Slurm; the notebooks then only aggregate.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "run"):
        p = sub.add_parser(name)
        p.add_argument("--profile", required=True, choices=config.profile_names())
        p.add_argument("--only", nargs="+", default=[], metavar="NB", help="notebooks whose names start with these")
        p.add_argument("--gpu-memory-gb", type=float, default=80.0, help="memory of one GPU (GPU shares, wall times)")
        p.add_argument("--units", nargs="+", default=[], metavar="KEY",
                       help="only the units whose keys match these patterns (fnmatch), with what they need")
        p.add_argument("--skip", nargs="+", default=[], metavar="KEY",
                       help="leave out the units whose keys match these patterns, and those that need them")
        p.add_argument("--wave", type=int, choices=WAVES,
                       help="a preregistered wave's runs instead of notebooks: 2 (profile confirm), 3 (profile wave3), "
                            "4 (profile wave4); "
                            "docs/preregistration.md")
    plan_parser = sub.choices["plan"]
    plan_parser.add_argument("--summary", action="store_true", help="totals only, not one line per unit")
    plan_parser.add_argument("--csv", type=Path, help="also write the units to this CSV file")
    plan_parser.add_argument("--no-measure", action="store_true", help="no rates: states and memory only")
    plan_parser.add_argument("--rates", metavar="FILE",
                             help="hours at the rates another machine saved (plugin-repro preflight --save-rates)")
    run_parser = sub.choices["run"]
    run_parser.add_argument("--executor", choices=EXECUTORS, default="local")
    run_parser.add_argument("--trainings-at-once", metavar="N|auto", type=lambda v: int(v) if v.isdigit() else v,
                            help="local, ray: units that train from the caches at once on a GPU, each a process with "
                                 "the base's output layer alone (default: the profile's trainings_at_once)")
    run_parser.add_argument("--rates", metavar="FILE",
                            help="local, ray: a rates file's measured process peak and concurrency curve for N")
    run_parser.add_argument("--address", help="ray: a running cluster ('auto', 'ray://host:10001')")
    run_parser.add_argument("--num-gpus", type=float, help="ray: GPUs of the local cluster it starts (default: detected)")
    run_parser.add_argument("--num-cpus", type=int, help="ray: CPUs of the local cluster it starts (default: detected)")
    run_parser.add_argument("--partition", help="slurm: partition")
    run_parser.add_argument("--account", help="slurm: account")
    run_parser.add_argument("--time-min", type=int, default=240, help="slurm: time limit per job, minutes")
    run_parser.add_argument("--gpus-per-job", type=int, default=1, help="slurm: GPUs per job (0 on a CPU cluster)")
    run_parser.add_argument("--cpus-per-job", type=int, default=1, help="slurm: CPUs per job")
    run_parser.add_argument("--mem-gb", type=float, help="slurm: memory per job")
    run_parser.add_argument("--units-per-job", type=int, default=8, help="slurm: units of one base per array task")
    run_parser.add_argument("--slurm-folder", type=Path, help="slurm: submitit's folder (default: the profile's logs)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .. import data
    from ..experiments import confirmation
    from ..harness.grid import plan as planning
    from . import studies

    profile = config.load_profile(args.profile)
    problems: dict[str, str] = {}
    try:
        if getattr(args, "trainings_at_once", None) is not None:  # checked as the profile's own setting is
            profile = profile.replace(trainings_at_once=args.trainings_at_once)
        wave_profile, wave_units = wave(args.wave) if args.wave else (None, None)
        if args.wave and profile.name != wave_profile:
            raise ValueError(f"--wave {args.wave} belongs to the {wave_profile!r} profile")
        units = (wave_units(profile) if args.wave else
                 studies.units(profile, args.only, problems if args.command == "plan" else None))
        units = select_units(units, args.units, args.skip)
    except (ValueError, data.MissingDataError) as err:
        parser.error(str(err))
    if args.command == "plan":
        plan = planning.make_plan(units, measure=not args.no_measure, rates_file=args.rates)
        only = sorted({nb for u in units for nb in u.notebooks}) if args.wave else args.only
        print_plan(plan, profile, only, show_units=not args.summary, problems=problems)
        if args.csv:
            write_csv(plan, args.csv)
        return 0

    if profile.name in confirmation.FROZEN_INPUT_FILES:  # the preregistered runs decode the frozen test inputs, or none
        try:
            for dataset in sorted({u.task.dataset for u in units}):
                confirmation.check_test_inputs(dataset, profile)
        except ValueError as err:
            parser.error(str(err))
    return _run(planning.make_plan(units, measure=False), profile, args)


def _run(plan: planning.Plan, profile: Profile, args: argparse.Namespace) -> int:
    """Compute the plan's pending units with the chosen executor; 0 when every unit is done,
    1 when some failed (the finished ones are stored), 2 when the executor cannot start."""
    from ..harness.planning import concurrency, preflight
    from ..harness.grid import executors, plan as planning

    started = time.perf_counter()
    print(f"[grid] {len(plan.pending())} of {len(plan.units)} units to compute with the {args.executor} executor.",
          file=sys.stderr)
    trainings = 1
    if args.executor != "slurm":  # a Slurm job is one unit's GPU
        rates = preflight.base_rates(profile, sorted({u.model for u in plan.pending()}), rates_file=args.rates,
                                     measure=False) if args.rates else None
        sharing = concurrency.for_run(profile, plan.pending(), rates=rates)
        trainings = sharing.trainings
        print(f"[grid] trainings from the caches: {sharing.why}.", file=sys.stderr)
    results: list[dict] = []
    with executors.exit_on_sigterm():  # kill or scancel: the executor still cleans up (Ray's local cluster)
        try:
            if args.executor == "local":
                results = executors.run_local(plan, trainings=trainings)
            elif args.executor == "ray":
                results = executors.run_ray(plan, address=args.address, gpu_memory_gb=args.gpu_memory_gb,
                                            num_gpus=args.num_gpus, num_cpus=args.num_cpus, trainings=trainings)
            else:
                folder = args.slurm_folder or machine.results_dir(profile) / "logs" / "slurm"
                results = executors.run_slurm(plan, executors.SlurmOptions(
                    folder=folder.resolve(), partition=args.partition, account=args.account, time_min=args.time_min,
                    gpus_per_job=args.gpus_per_job, cpus_per_job=args.cpus_per_job, mem_gb=args.mem_gb,
                    units_per_job=args.units_per_job))
        except executors.MissingEngine as err:
            print(f"plugin-repro grid: {err}", file=sys.stderr)
            return 2
    planning.refresh(plan)
    left = plan.pending()
    print(f"[grid] {len(plan.units) - len(left)} of {len(plan.units)} units done "
          f"({time.perf_counter() - started:.0f} s).", file=sys.stderr)
    failed = executors.failures(results)
    for failure in failed:
        print(f"[grid] failed: {failure['key']}: {failure['error']}", file=sys.stderr)
    unexplained = sorted({u.key for u in left} - {f["key"] for f in failed})
    if unexplained:  # computed without an error, yet their records are not the plan's: keys that moved
        print(f"[grid] {len(unexplained)} unit(s) ran without an error but their records are not current under the "
              f"plan's keys (a fault in the package: please report it), e.g. {unexplained[0]}.", file=sys.stderr)
    elif left:
        print("[grid] the finished units are stored: mend the failures above and run again to resume.", file=sys.stderr)
    return 0 if not left else 1
