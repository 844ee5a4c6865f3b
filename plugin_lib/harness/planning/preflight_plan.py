"""The preflight's plan: the work of every notebook at a profile's settings (configurations,
trainings, tokens to decode, caches, fine-tuned models, weights and peak GPU memory), summed
over the notebook's units of the grid (``harness.grid.units``) with the one cost model
(``harness.planning.costs``), each unit under the first notebook that lists it: a run two notebooks
share is counted once, as it is run once.

The units come from the study registry (``plugin_lib.commands.studies``), above this layer;
``harness.planning.preflight`` prints the plan.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import costs
from .gpus import GpuClass

if TYPE_CHECKING:
    from ..grid.units import Unit


@dataclass
class Plan:
    """The work of one notebook; counts are upper bounds where the run may stop earlier.
    ``note``: why it has no units (its work stays in the notebook), or where they are not
    planned here (``problem``: its data is missing)."""

    notebook: str
    tally: costs.Tally = costs.Tally()  # configurations, trainings, tokens decoded, bytes written
    pairs: int = 0
    seeds: int = 0
    epochs: int = 0
    peak_gpu: int = 0
    note: str = ""
    problem: str = ""
    # The work the time estimate multiplies by rates, per base model (``costs.work``'s keys).
    work: list[dict] = field(default_factory=list)
    # Per base: the peaks that decide how many trainings share a GPU (``costs.base_peaks``).
    base_peaks: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add_work(self, model: str, **work) -> None:
        self.work.append({"model": model, **work})


def plan_notebooks(units: Sequence[Unit], notebooks: dict[str, str], gpu: bool | GpuClass,
                   problems: dict[str, str] | None = None) -> list[Plan]:
    """A plan per notebook of ``notebooks`` (name: a note, e.g. why its work stays in the
    notebook) from ``units`` (merged across notebooks); ``problems``: notebooks whose units could
    not be made here, and why. ``gpu``: the dtypes (and memory) of a GPU."""
    plans = {name: Plan(name, note=note, problem=(problems or {}).get(name, "")) for name, note in notebooks.items()}
    pairs: dict[str, dict] = {name: {} for name in notebooks}  # per notebook: pairs of each dataset it reads
    for unit in units:
        counts = costs.counts_of(unit)
        for notebook in unit.notebooks:
            if notebook in plans:
                plans[notebook].peak_gpu = max(plans[notebook].peak_gpu, costs.gpu_bytes(unit, gpu))
                pairs[notebook][unit.task.dataset] = max(counts.pairs, pairs[notebook].get(unit.task.dataset, 0))
                plans[notebook].base_peaks = costs.merge_peaks(plans[notebook].base_peaks,
                                                               costs.base_peaks([unit], gpu))
        owner = next((nb for nb in unit.notebooks if nb in plans), None)
        if owner is None:
            continue
        plan = plans[owner]
        found = costs.tally(unit, gpu, counts)
        plan.tally += found
        if unit.seed is not None:
            plan.seeds = max(plan.seeds, len(unit.profile.seeds))
        if found.trainings:
            plan.epochs = unit.profile.training.max_epochs
        plan.add_work(costs.shape_of(unit), **costs.work(unit, gpu, counts))
    for name, plan in plans.items():
        plan.pairs = sum(pairs[name].values())
    return list(plans.values())

