"""Train a configuration of a coordinate search ahead of the search, on an idle core.

A coordinate search (``grid.search: coordinate``) is one unit of the grid: it decides its next
configuration from the last, so one worker trains them one after another. The configurations of
the axis it is on do not depend on each other, though: it trains every one of them before it
chooses. So while the search trains one, another process can train the next of the same axis.

This script replays the search's walk on the losses recorded so far (``coordinate_axis``) to find
that axis, and trains only a configuration on it: one the search is certain to train. A
configuration off the walk is refused, since it could become the record's best and so change
the selection. It trains with the search's own function (``search.train_config``, which the
grid's ``config`` units call): under the configuration's lock, into the selection record re-read
under the selection's lock. The search then finds it recorded; the record is the one the search
would have written (same seed, data and settings; its provenance names this process's code).

Run it with the code that runs the search (for the confirmation's wave 2, its worktree):

    PYTHONPATH=/work/wave2-run python scripts/train_search_config.py --profile confirm --wave 2 \\
        --selection runs/commongen/smollm2-135m-instruct/LoRA-selection --set lr=0.0003 weight_decay=1
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from plugin_lib.commands import confirmation_wave2
from plugin_lib.commands import studies
from plugin_lib.core import grid_search
from plugin_lib.harness.running import run_keys, search
from plugin_lib.harness.grid import units as grid_units
from plugin_lib.harness.profile import load_profile


def coordinate_axis(losses: dict[str, float], values: dict[str, list[float]], extend_edges: int) -> list[dict]:
    """The configurations the coordinate search has left on the axis it is on, in its order;
    [] when its walk is complete. ``losses``: the recorded hyper-validation losses by
    ``run_keys.config_tag``. The walk is ``search.select_hparams``' own, on those losses: the
    middle of each list first, one key at a time, an edge pushed while the choice sits on it."""
    values = {k: list(v) for k, v in values.items()}
    current = {k: sorted(v)[len(v) // 2] for k, v in values.items()}
    for key in values:
        extended = 0
        while True:
            axis = [{**current, key: v} for v in values[key]]
            left = [c for c in axis if run_keys.config_tag(c) not in losses]
            if left:
                return left
            on_axis = {v: losses[run_keys.config_tag({**current, key: v})] for v in values[key]}
            current[key] = min(on_axis, key=on_axis.get)  # the first of equals, in list order
            step = grid_search.beyond_edge(values[key], current[key], key)
            if step is None or extended >= extend_edges:
                break
            values[key].append(step)
            extended += 1
    return []


def parse_settings(pairs: list[str]) -> dict[str, float]:
    """``key=value`` pairs as numbers."""
    wanted = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set {pair!r}: write key=value.")
        try:
            wanted[key] = float(value)
        except ValueError:
            raise SystemExit(f"--set {pair!r}: {value!r} is not a number.") from None
    return wanted


def config_on_axis(wanted: dict[str, float], axis: list[dict], tag: str) -> dict:
    """The configuration of ``axis`` that ``wanted`` names (its values as the search has them)."""
    for config in axis:
        if sorted(config) == sorted(wanted) and all(float(config[k]) == wanted[k] for k in config):
            return config
    left = ", ".join(run_keys.config_tag(c) for c in axis) or "none: its walk is complete"
    raise SystemExit(f"{tag}'s search is not certain to train {wanted}; the configurations it has left on the "
                     f"axis it is on: {left}.")


def config_unit(selection: grid_units.Unit, hparams: dict) -> grid_units.Unit:
    """The ``config`` unit of one configuration of ``selection``'s search."""
    folder = selection.key.rsplit("/", 1)[0]
    return dataclasses.replace(selection, kind="config", key=f"{folder}/{selection.label}-{run_keys.config_tag(hparams)}",
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
    if profile.grid.search != "coordinate":
        raise SystemExit(f"The {profile.name!r} profile searches the full grid: each configuration is a unit of "
                         "its own already (`grid run --units '*-lr=*'`).")
    wanted = parse_settings(args.set)
    units = confirmation_wave2.units(profile) if args.wave else studies.units(profile, args.only)
    found = [u for u in units if u.key == args.selection and u.kind == "selection"]
    if not found:
        names = sorted(u.key for u in units if u.kind == "selection")
        raise SystemExit(f"No search {args.selection!r} among the units; the searches are: {', '.join(names)}")
    selection = found[0]
    task = grid_units.worker_task(selection.task, selection.profile)
    record = search.stored_selection(task, selection.method, selection.profile, arch=selection.arch_dict,
                                     label=selection.label) or {"configs": {}}
    losses = {tag: config["val_loss"] for tag, config in record["configs"].items()}
    values = {k: list(getattr(profile.grid, k)) for k in run_keys.grid_keys(selection.method)}
    axis = coordinate_axis(losses, values, profile.grid.extend_edges)
    unit = config_unit(selection, config_on_axis(wanted, axis, selection.key))
    print(f"[train_search_config] {unit.key}", file=sys.stderr)
    print(grid_units.execute(unit), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
