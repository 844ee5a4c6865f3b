"""The study registry: each notebook's study, declared once.

A study names its notebook, the module that computes it, and where its work is declared: the
units of the grid it makes (``units(profile, notebook)``: every record it stores, keyed as the
notebook's own calls key them), or, for a study whose work stays in the notebook, why. Everything
that needs to know a study's work asks here: the grid (``plugin-repro grid``) runs its units, the
preflight (``plugin-repro preflight``) and ``grid plan`` price the same units with the one cost
model (``harness.costs``), and the orchestrator (``plugin-repro run``) finds the notebooks here.

It lives above the layers (``plugin_lib.commands``), as it imports every notebook's module; the
harness never imports upwards (HELM's run specs and lm-evaluation-harness's task registry keep
their declarations apart from the machinery the same way).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import data
from ..experiments import (ablations, adidas, api, base_quality, dataset_statistics, main_tables, proxy, shift,
                           table5, table8, theorem1, topk)
from ..harness.grid import units as grid_units
from ..harness.profile import Profile

UnitsOf = Callable[[Profile, str], list]


@dataclass(frozen=True)
class Study:
    """One notebook's study: ``notebook`` (its file name without ``.ipynb``), ``module`` (the
    ``plugin_lib.experiments`` module its cells call), ``datasets`` it reads, and either
    ``units`` (its work, as the grid's units) or ``in_notebook`` (why its work stays there)."""

    notebook: str
    module: object
    datasets: tuple[str, ...]
    units: UnitsOf | None = None
    in_notebook: str = ""

    def __post_init__(self):
        if (self.units is None) == (not self.in_notebook):
            raise ValueError(f"{self.notebook}: a study declares its units or why its work stays in the notebook.")


def _main_table(dataset: str) -> UnitsOf:
    return lambda profile, notebook: grid_units.table_units(dataset, profile, notebook)


MAIN = dict(zip(("01_table1_e2e", "02_table2_webnlg", "03_table3_commongen", "04_table4_adidas"), data.DATASETS))
ALL = tuple(data.DATASETS)

STUDIES: tuple[Study, ...] = (
    Study("00_dataset_statistics", dataset_statistics, ALL, in_notebook="counts the data (seconds)"),
    *(Study(notebook, main_tables, (dataset,), _main_table(dataset)) for notebook, dataset in MAIN.items()),
    Study("05_table5_bdpl_wrapper", table5, ALL, table5.units),
    Study("06_fig2_base_quality", base_quality, ("e2e",), base_quality.units),
    Study("07_fig3_reweighting_complexity", ablations, ("e2e",), ablations.complexity_units),
    Study("08_fig7_architecture", ablations, ("e2e",), ablations.architecture_units),
    Study("09_adidas_case_study", adidas, ("adidas",), in_notebook="reads notebook 04's runs"),
    Study("10_distribution_shift", shift, ("webnlg", "commongen"), shift.units),
    Study("11_table8_lora", table8, ALL, table8.units),
    Study("12_topk_logprobs", topk, ("e2e",), topk.units),
    Study("13_theorem1_convergence", theorem1, (), in_notebook="a synthetic study on the CPU (minutes)"),
    Study("14_api_model", api, ("e2e",), in_notebook="a base behind an API server it starts itself"),
    Study("15_proxy_tuning", proxy, ALL, proxy.units),
)
NOTEBOOKS = tuple(study.notebook for study in STUDIES)
BY_NOTEBOOK = {study.notebook: study for study in STUDIES}


def notebook_of(units: UnitsOf) -> str:
    """The notebook whose work ``units`` declares (a wave that reuses a study's units names it so)."""
    return next(study.notebook for study in STUDIES if study.units == units)


def chosen(only: Sequence[str] = ()) -> list[Study]:
    """The studies whose notebooks start with one of ``only`` (all by default)."""
    found = [s for s in STUDIES if not only or any(s.notebook.startswith(o) for o in only)]
    if not found:
        raise ValueError(f"--only {' '.join(only)} matches no notebook; the notebooks: {', '.join(NOTEBOOKS)}.")
    return found


def units(profile: Profile, only: Sequence[str] = (), problems: dict[str, str] | None = None
          ) -> list[grid_units.Unit]:
    """The units of the studies of ``only`` (all by default), one per record, merged across
    notebooks that share it. With ``problems``, a study whose data this machine lacks (e.g. E2E's
    train split, which notebook 06 fine-tunes on, offline) is left out and the reason kept there;
    otherwise the error stops the call."""
    found = []
    for study in chosen(only):
        if study.units is None:
            continue
        try:
            found += study.units(profile, study.notebook)
        except (data.MissingDataError, ValueError) as err:
            if problems is None:
                raise
            problems[study.notebook] = f"not planned here: {err}"
    return grid_units.merge(found)


def notes(only: Sequence[str] = ()) -> dict[str, str]:
    """Each chosen notebook's note for a plan: why its work stays in the notebook, or ''."""
    return {study.notebook: study.in_notebook for study in chosen(only)}
