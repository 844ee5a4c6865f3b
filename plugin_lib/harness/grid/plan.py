"""A plan of units: their state, GPU memory and time, and the wall time on 1, 8 and 32 GPUs.

Memory and time come from the preflight (``harness.planning.preflight``): the peak of the unit's base
at the profile's settings, and its work (forward tokens, training pair-epochs, decoding steps)
at rates measured on this machine (``preflight.measure_rates``), or, for a GPU profile on a
machine without a GPU, the H100 rates of an earlier probe of the paper's shapes, which time
cache building and training only (decoding is then counted as zero, and the plan says so).
Training counts every epoch (an upper bound: training stops early). Once a profile has stored
selections, a second, likely estimate counts the epochs its trainings ran on average and the
configurations its searches tried (:func:`calibration`), and, once units of a kind are done,
scales that kind's pending units by the seconds their stored records took over the estimate of
the same units (:func:`scale_to_stored`): a few seconds of timing probes, often taken while
other workers share the cores, can miss by a factor of ten, the stored runs do not.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..planning import concurrency, costs, preflight
from .. import machine
from .. import profile as config
from ..planning.preflight_counts import count_task
from ..planning.preflight_rates import Rates, reference_rates
from ..profile import Profile
from ...utils.io import read_json
from .units import KINDS, Unit, is_done, stored_selection

GIB = 2**30


@dataclass
class Plan:
    """Units in dependency order with their state and estimates.

    ``state``: done (record current), ready (every unit it needs is done) or waiting.
    ``seconds`` (upper bounds) and ``gpu_bytes``: per unit; ``timed``: what the seconds cover;
    ``likely``: per unit, the seconds at the epochs and configurations the profile's stored
    selections took (empty without them); ``calibrated``: from what; ``stored``: per done unit,
    the seconds its record says it took (:func:`stored_seconds`)."""

    units: list[Unit]
    state: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    gpu_bytes: dict[str, int] = field(default_factory=dict)
    timed: str = ""
    probed: bool = False  # timed at the H100 probe's rates (no GPU here): decoding not priced
    likely: dict[str, float] = field(default_factory=dict)
    calibrated: str = ""
    stored: dict[str, float] = field(default_factory=dict)
    configs_stored: dict[str, int] = field(default_factory=dict)
    # Per base: how a search's configurations are priced, and how many share a GPU (harness.planning.concurrency;
    # the preflight's words for it).
    pricing: dict[str, str] = field(default_factory=dict)

    def pending(self) -> list[Unit]:
        return [u for u in self.units if self.state.get(u.key) != "done"]

    def critical_path(self) -> tuple[float, list[str]]:
        """The longest chain of pending units by estimated seconds: no number of GPUs finishes
        sooner."""
        longest: dict[str, tuple[float, list[str]]] = {}
        for unit in self.units:  # dependency order
            if self.state.get(unit.key) == "done":
                longest[unit.key] = (0.0, [])
                continue
            before = max((longest[k] for k in unit.needs if k in longest), default=(0.0, []), key=lambda t: t[0])
            longest[unit.key] = (before[0] + self.seconds.get(unit.key, 0.0), before[1] + [unit.key])
        return max(longest.values(), default=(0.0, []), key=lambda t: t[0])

    def wall_seconds(self, gpus: int, seconds: dict[str, float] | None = None) -> float:
        """Wall time of the pending units on ``gpus`` GPUs, one unit per GPU at a time, ready units
        started longest-chain first, at ``seconds`` per unit (default: the upper bounds). (Ray may
        also pack small units onto one GPU by memory, ``gpu_share``; that helps only where a unit
        leaves the GPU idle, so it is not counted.)"""
        seconds = self.seconds if seconds is None else seconds
        pending = {u.key: u for u in self.pending()}
        if not pending:
            return 0.0
        dependents: dict[str, list[str]] = {k: [] for k in pending}
        for unit in pending.values():
            for need in unit.needs:
                if need in pending:
                    dependents[need].append(unit.key)
        rest: dict[str, float] = {}  # the longest chain from each unit to the end
        for unit in reversed(self.units):
            if unit.key in pending:
                rest[unit.key] = seconds.get(unit.key, 0.0) + max((rest[d] for d in dependents[unit.key]),
                                                                      default=0.0)
        waiting = {k: sum(n in pending for n in u.needs) for k, u in pending.items()}
        ready = [(-rest[k], k) for k, n in waiting.items() if n == 0]
        heapq.heapify(ready)
        running: list[tuple[float, str]] = []
        now = 0.0
        while ready or running:
            while ready and len(running) < gpus:
                _, key = heapq.heappop(ready)
                heapq.heappush(running, (now + seconds.get(key, 0.0), key))
            now, key = heapq.heappop(running)
            for dep in dependents[key]:
                waiting[dep] -= 1
                if waiting[dep] == 0:
                    heapq.heappush(ready, (-rest[dep], dep))
        return now


def gpu_share(need: int, gpu_bytes: int) -> float:
    """The share of one GPU a unit asks for: its peak over the GPU's memory, in eighths, at
    least one eighth and at most the whole GPU."""
    if gpu_bytes <= 0:
        return 1.0
    return min(1.0, max(1, math.ceil(8 * need / gpu_bytes)) / 8)


def topological(units: Sequence[Unit]) -> list[Unit]:
    """``units`` with every unit after the units it needs (needs outside the list are ignored);
    a cycle is an error."""
    by_key = {u.key: u for u in units}
    order, state = [], {}

    def visit(unit: Unit, stack: tuple[str, ...]) -> None:
        if state.get(unit.key) == 2:
            return
        if state.get(unit.key) == 1:
            raise ValueError(f"The units' dependencies form a cycle: {' -> '.join(stack + (unit.key,))}")
        state[unit.key] = 1
        for need in unit.needs:
            if need in by_key:
                visit(by_key[need], stack + (unit.key,))
        state[unit.key] = 2
        order.append(unit)

    for unit in units:
        visit(unit, ())
    return order


def with_needs(units: Sequence[Unit], wanted: Sequence[Unit]) -> list[Unit]:
    """``wanted`` and every unit of ``units`` they need, transitively."""
    by_key = {u.key: u for u in units}
    keep: dict[str, Unit] = {}
    stack = list(wanted)
    while stack:
        unit = stack.pop()
        if unit.key in keep:
            continue
        keep[unit.key] = unit
        stack += [by_key[k] for k in unit.needs if k in by_key]
    return [u for u in units if u.key in keep]


def refresh(plan: Plan) -> Plan:
    """Each unit's state from the store."""
    done = {u.key for u in plan.units if is_done(u)}
    planned = {u.key for u in plan.units}
    for unit in plan.units:
        if unit.key in done:
            plan.state[unit.key] = "done"
        elif all(k in done for k in unit.needs if k in planned):
            plan.state[unit.key] = "ready"
        else:
            plan.state[unit.key] = "waiting"
    return plan


@dataclass(frozen=True)
class Calibration:
    """How a profile's trainings went so far: the mean epochs a configuration ran and the mean
    configurations a selection tried, over ``selections`` stored selection records."""

    epochs: float
    configs: float
    selections: int


CALIBRATE_FROM = 3  # stored selections (or done units of a kind, for the scale), at least
STORED_KINDS = ("selection", "run", "bdpl")  # kinds whose records say the seconds they took


def calibration(profile: Profile) -> Calibration | None:
    """From the profile's stored selection records (CALIBRATE_FROM at least), else None."""
    tried = [list(read_json(path).get("configs", {}).values())
             for path in sorted((machine.results_dir(profile) / "runs").glob("**/*-selection.json"))]
    tried = [configs for configs in tried if configs]
    epochs = [c["epochs_run"] for configs in tried for c in configs if "epochs_run" in c]
    if len(tried) < CALIBRATE_FROM or not epochs:
        return None
    return Calibration(sum(epochs) / len(epochs), sum(map(len, tried)) / len(tried), len(tried))


def _coordinate_selection(unit: Unit) -> bool:
    """A selection whose record holds its configurations (a grid search's are config units)."""
    return unit.kind == "selection" and unit.profile.grid.search != "grid"


def _record(unit: Unit) -> dict | None:
    try:
        return read_json(machine.results_dir(unit.profile) / f"{unit.key}.json")
    except (OSError, ValueError):
        return None


def stored_seconds(unit: Unit) -> float | None:
    """The seconds a done unit's record says it took (wall time, pauses included): a run's or a
    BDPL prompt search's ``seconds``, or a selection's configurations' seconds summed; None for
    other kinds, a missing record, or a grid search (its configurations are config units of
    their own)."""
    if unit.kind not in STORED_KINDS or (unit.kind == "selection" and not _coordinate_selection(unit)):
        return None
    record = _record(unit)
    if record is None:
        return None
    if unit.kind != "selection":
        return record.get("seconds")
    seconds = [c["seconds"] for c in record.get("configs", {}).values() if "seconds" in c]
    return sum(seconds) if seconds else None


def configs_stored(unit: Unit) -> int:
    """The configurations a coordinate search's record already holds (0 for other units): a
    search under way resumes from them, so only the rest is left to train."""
    record = stored_selection(unit) if _coordinate_selection(unit) else None
    return len(record["configs"]) if record else 0


def scale_to_stored(plan: Plan) -> dict[str, tuple[float, int]]:
    """Scale the likely seconds of each kind's pending units by the ratio of the seconds stored by
    its done units (``plan.stored``) to the likely estimate of those same units, for kinds with CALIBRATE_FROM such
    units at least; returns the ratio and the count per kind scaled."""
    scales, stored = {}, plan.stored
    for kind in STORED_KINDS:
        done = [u.key for u in plan.units if u.kind == kind and plan.state.get(u.key) == "done"
                and stored.get(u.key) is not None and plan.likely.get(u.key, 0.0) > 0]
        if len(done) < CALIBRATE_FROM:
            continue
        ratio = sum(stored[k] for k in done) / sum(plan.likely[k] for k in done)
        scales[kind] = (ratio, len(done))
        for unit in plan.pending():
            if unit.kind == kind and unit.key in plan.likely:
                plan.likely[unit.key] *= ratio
    return scales


def make_plan(units: Sequence[Unit], *, measure: bool = True, with_state: bool = True,
              rates_file: str | None = None) -> Plan:
    """The plan of ``units``: dependency order, state (``with_state``) and estimates (at the rates
    of ``rates_file`` if given, ``preflight --save-rates``)."""
    plan = Plan(topological(units))
    if with_state:
        refresh(plan)
        plan.stored = {u.key: s for u in plan.units
                       if plan.state[u.key] == "done" and (s := stored_seconds(u)) is not None}
        plan.configs_stored = {u.key: n for u in plan.pending() if (n := configs_stored(u))}
    _estimate(plan, measure, rates_file)
    return plan


def _estimate(plan: Plan, measure: bool, rates_file: str | None = None) -> None:
    """Each unit's seconds (at most, and likely with a calibration) and GPU memory, priced with
    the one cost model (``harness.planning.costs``) at each base's rates (``preflight.base_rates``)."""
    profiles = {u.profile for u in plan.units}
    has_gpu = torch.cuda.is_available()
    rates: dict[tuple[str, str], Rates | None] = {}
    calibrations = {p.name: calibration(p) for p in profiles} if measure else {}
    probed = False
    peaks = costs.base_peaks(plan.units, has_gpu or any(p.name in config.GPU_PROFILES for p in profiles))
    for unit in plan.units:
        profile = unit.profile
        gpu = has_gpu or profile.name in config.GPU_PROFILES
        model = costs.shape_of(unit)
        counts = costs.counts_of(unit)
        plan.gpu_bytes[unit.key] = costs.gpu_bytes(unit, gpu)
        key = (model, profile.name)
        if key not in rates:
            rates[key] = _rates(model, profile, measure, rates_file)
            probed |= rates[key] is not None and rates[key].measured_with.startswith("probe")
            if rates[key] is not None:  # as the profile runs: trainings at once, LoRA as its peak decides
                gpu_bytes = concurrency.planning_gpu_bytes(rates[key], None, profile) if gpu else None
                rates[key], sharing = concurrency.priced(model, rates[key], profile, peaks.get(model, (0, 0)),
                                                         gpu_bytes)
                plan.pricing[model] = concurrency.basis(rates[key], sharing)
        r = rates[key]
        under_way = plan.configs_stored.get(unit.key, 0)
        plan.seconds[unit.key] = r.seconds(costs.work(unit, gpu, counts, under_way=under_way)) if r is not None else 0.0
        if r is not None and (c := calibrations.get(profile.name)):
            plan.likely[unit.key] = r.seconds(costs.work(unit, gpu, counts, epochs=c.epochs, configs=c.configs,
                                                         under_way=under_way))
    names = ", ".join(sorted(p.name for p in profiles))
    plan.calibrated = "; ".join(
        f"{p.name}: {c.epochs:.1f} epochs a training (of {p.training.max_epochs}) and {c.configs:.1f} "
        f"configurations a selection, over {c.selections} stored selections"
        for p in sorted(profiles, key=lambda p: p.name) if (c := calibrations.get(p.name)))
    if plan.likely:
        scales = scale_to_stored(plan)
        if scales:
            plan.calibrated += ("; then scaled to the seconds stored by done units: " + ", ".join(
                f"{kind} x{ratio:.2f} (over {n})" for kind, (ratio, n) in scales.items()))
    if plan.configs_stored:
        searches, held = len(plan.configs_stored), sum(plan.configs_stored.values())
        plan.calibrated += (f"; {searches} selection{'s' * (searches != 1)} under way counted without the "
                            f"{held} configuration{'s' * (held != 1)} "
                            + ("its record holds" if searches == 1 else "their records hold"))
    if not measure and not rates_file:
        plan.timed = "not timed (--no-measure)"
    elif rates_file:
        plan.timed = f"{names}: rates read from {rates_file}"
    elif probed:
        plan.probed = True
        plan.timed = (f"{names}: cache building and training at H100 rates of an earlier probe of the paper's shapes "
                      "(no GPU here); decoding not timed")
    else:
        plan.timed = f"{names}: rates measured on this machine ({machine.device()})"


def _rates(model: str, profile: Profile, measure: bool, rates_file: str | None) -> Rates | None:
    """The preflight's rates of ``model`` (read, or measured here); for a GPU profile on a machine
    without a GPU, the H100 probe's for cache building and training."""
    if rates_file or (measure and (torch.cuda.is_available() or profile.name not in config.GPU_PROFILES)):
        return preflight.base_rates(profile, [model], rates_file=rates_file)[model]  # read, or measured here
    if not measure:
        return None
    reference = reference_rates(model)
    if reference is None:
        return None
    pair_tokens = max(count_task("e2e", model, profile).pair_tokens, 1.0)
    return Rates(measured_with="probe (H100)", forward_tokens_per_s=reference["cache"] * pair_tokens,
                 train_pairs_per_s=reference["train"], decode_step_s=0.0, plugin_step_s=0.0, device="cuda")


def kind_summary(plan: Plan) -> list[tuple]:
    """Per kind: units, done, ready, waiting, hours at most and likely hours (pending units; the
    likely ones None without a calibration)."""
    rows = []
    for kind in KINDS:
        units = [u for u in plan.units if u.kind == kind]
        if units:
            states = [plan.state.get(u.key, "?") for u in units]
            pending = [u.key for u in units if plan.state.get(u.key) != "done"]
            hours = sum(plan.seconds.get(k, 0.0) for k in pending) / 3600
            likely = sum(plan.likely.get(k, 0.0) for k in pending) / 3600 if plan.likely else None
            rows.append((kind, len(units), states.count("done"), states.count("ready"), states.count("waiting"), hours,
                         likely))
    return rows
