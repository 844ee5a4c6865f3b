"""``plugin-repro preflight --profile NAME``: the plan of a whole run before it starts (work,
memory, disk and hours per notebook; ``harness.planning.preflight``).

The notebooks' work is the study registry's units (``commands.studies``), priced with the one
cost model (``harness.planning.costs``), so the preflight and ``plugin-repro grid plan`` agree on the
hours given the same rates (``--rates FILE``).

Its parser needs only light modules, so that ``--help`` and a usage error are answered before
the planning imports torch and every notebook's module: those imports sit in the functions.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..harness.planning import gpus
from ..harness import machine
from ..harness import profile as config

if TYPE_CHECKING:
    from ..harness.planning.preflight_plan import Plan


def some_data_first() -> None:
    """No dataset at all: said at once (MissingDataError, its one line), before planning converts
    or loads a model. With some datasets, the notebooks of the others are planned without units."""
    from ..data import integrity, sources
    from ..data.files import data_dir

    root = data_dir()
    if root is None:  # the Hub
        return
    absent = [(group, relpath) for group in sources.GROUPS for relpath in integrity.REQUIRED.get(group, ())
              if not (root / relpath).is_file()]
    if {group for group, _ in absent} == {group for group in sources.GROUPS if integrity.REQUIRED.get(group)}:
        integrity.verify_file(root, absent[0][1])


def plans(profile: config.Profile, only: Sequence[str] = (), gpu_name: str | None = None) -> list[Plan]:
    """The plan of each notebook of ``only`` (all by default) at the dtypes it will run in; a
    notebook whose data this machine lacks is planned without units, the reason kept."""
    from ..harness.planning import preflight
    from ..harness.planning.preflight_plan import plan_notebooks
    from . import studies

    some_data_first()
    problems: dict[str, str] = {}
    units = studies.units(profile, only, problems)
    _, gpu = preflight.planning_gpu(profile, gpu_name)
    return plan_notebooks(units, studies.notes(only), gpu, problems)


def disk_check(profile_name: str, notebooks: Sequence[str], *, disk_free_gb: float | None = None,
               out=sys.stdout) -> int:
    """Whether the disk holds what ``notebooks`` (names without .ipynb) may still write."""
    from ..harness.planning import preflight
    from . import studies

    profile = config.load_profile(profile_name)
    wanted = [nb for nb in notebooks if nb in studies.BY_NOTEBOOK]
    chosen = plans(profile, wanted) if wanted else []
    return preflight.disk_check(profile, chosen, disk_free_gb=disk_free_gb, out=out)


def run(profile_name: str, *, gpu_name: str | None = None, **options) -> int:
    """The preflight of ``profile_name`` (``harness.planning.preflight.run``'s options)."""
    from ..harness.planning import preflight

    started = time.perf_counter()  # the time it prints counts the plans too (the data's token counts)
    profile = config.load_profile(profile_name)
    return preflight.run(profile, plans(profile, gpu_name=gpu_name), gpu_name=gpu_name, started=started, **options)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="plugin-repro preflight",
                                     description="The plan of a run: work, memory, disk and hours per notebook.")
    parser.add_argument("--profile", required=True, choices=config.profile_names())
    parser.add_argument("--gpu-memory-gb", type=float, help="check against this much GPU memory instead of the GPU's")
    parser.add_argument("--disk-free-gb", type=float, help="check against this much free disk instead of the disk's")
    parser.add_argument("--no-measure", action="store_true", help="counts only: measure no rates")
    parser.add_argument("--plan-only", action="store_true",
                        help="print the plan and stop nothing (what would stop a run becomes a warning)")
    parser.add_argument("--gpu", choices=list(gpus.GPUS),
                        help="plan for this GPU: its memory and dtypes, hours estimated from its published throughput")
    parser.add_argument("--rates", metavar="FILE", help="hours from the rates another machine saved with --save-rates")
    parser.add_argument("--save-rates", metavar="FILE", help="write the rates measured here (to plan elsewhere with --rates)")
    parser.add_argument("--only", default="", help="check the memory of the notebooks whose names start with this")
    parser.add_argument("--disk-only", nargs="+", metavar="NOTEBOOK",
                        help="check only the disk these notebooks may still write (names without .ipynb)")
    args = parser.parse_args(argv)
    from ..data.integrity import DataError, MissingDataError

    try:
        if args.disk_only:
            return disk_check(args.profile, args.disk_only, disk_free_gb=args.disk_free_gb)
        return run(args.profile, gpu_memory_gb=args.gpu_memory_gb, disk_free_gb=args.disk_free_gb,
                   measure=not args.no_measure, plan_only=args.plan_only, gpu_name=args.gpu, only=args.only,
                   rates_file=args.rates, save_rates_file=args.save_rates)
    except (MissingDataError, DataError, machine.CacheDirError) as err:  # one line that says what to do
        print(f"preflight: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
