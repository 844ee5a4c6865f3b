"""Train one configuration of a hyperparameter search ahead of the search, on an idle core.

A coordinate search (``grid.search: coordinate``) is one unit of the grid: it decides its next
configuration from the last, so one worker trains them one after another. The values of the axis
it is on do not depend on each other, though: while the search trains one, another process can
train the next one of the same axis. This script trains that configuration with the search's own
function (``runner.train_config``, which the grid's ``config`` units call): under the
configuration's lock, into the selection record, re-read under the selection's lock. The search
then finds it recorded and goes on; the record is the one the search would have written (the
same seed, data and settings; its provenance names this process's code and device).

Run it with the code that runs the search (for the confirmation's wave 2, its worktree):

    PYTHONPATH=/work/wave2-run python scripts/train_search_config.py --profile confirm --wave 2 \\
        --selection runs/commongen/smollm2-135m-instruct/LoRA-selection --set lr=0.0003 weight_decay=1

It trains only values the profile's grid lists (an edge the search pushed further is its own to
train), and nothing that is recorded already.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from plugin_lib.commands import confirmation_wave2
from plugin_lib.commands.grid import notebook_units
from plugin_lib.harness import runner
from plugin_lib.harness.grid import units as grid_units
from plugin_lib.harness.profile import load_profile


def parse_settings(pairs: list[str], profile) -> dict:
    """``key=value`` pairs as the profile's own grid values (int or float as listed there)."""
    hparams = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        listed = getattr(profile.grid, key, None) if key in runner.grid_keys("WeightedComb") else None
        if listed is None:
            raise SystemExit(f"--set {pair!r}: the key must be one of {runner.grid_keys('WeightedComb')}, as key=value.")
        try:
            number = float(value)
        except ValueError:
            raise SystemExit(f"--set {pair!r}: {value!r} is not a number.") from None
        matches = [v for v in listed if float(v) == number]
        if not matches:
            raise SystemExit(f"--set {pair!r}: the {profile.name!r} profile's grid lists {key} = {list(listed)}; "
                             "train only those (the search pushes its edges itself).")
        hparams[key] = matches[0]
    return hparams


def config_unit(selection: grid_units.Unit, hparams: dict) -> grid_units.Unit:
    """The ``config`` unit of one configuration of ``selection``'s search."""
    if sorted(hparams) != sorted(runner.grid_keys(selection.method)):
        raise SystemExit(f"{selection.method}'s search sets {runner.grid_keys(selection.method)}; got {sorted(hparams)}.")
    folder = selection.key.rsplit("/", 1)[0]
    return dataclasses.replace(selection, kind="config", key=f"{folder}/{selection.label}-{runner.config_tag(hparams)}",
                               hparams=tuple(sorted(hparams.items())), needs=())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True)
    parser.add_argument("--wave", type=int, choices=(2,), help="the confirm profile's second wave's units")
    parser.add_argument("--only", nargs="*", default=(), help="notebooks whose units to look in (without --wave)")
    parser.add_argument("--selection", required=True, help="the search's unit key, as `grid plan` lists it")
    parser.add_argument("--set", nargs="+", required=True, metavar="KEY=VALUE", help="the configuration")
    args = parser.parse_args(argv)

    profile = load_profile(args.profile)
    units = confirmation_wave2.units(profile) if args.wave else notebook_units(profile, args.only)
    found = [u for u in units if u.key == args.selection and u.kind == "selection"]
    if not found:
        names = sorted(u.key for u in units if u.kind == "selection")
        raise SystemExit(f"No search {args.selection!r} among the units; the searches are: {', '.join(names)}")
    unit = config_unit(found[0], parse_settings(args.set, profile))
    print(f"[train_search_config] {unit.key}", file=sys.stderr)
    print(grid_units.execute(unit), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
