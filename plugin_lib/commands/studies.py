"""The study registry: each notebook's study, declared once, read by everyone.

A study names its notebook, the section of REPORT.md its results fill (title and the stems of
the tables and figures it writes), the data it reads, and its work: the units of the grid it
makes, or, for a study whose work stays in the notebook, why. A study's units come from the same
parameters its notebook runs with: the registry reads the notebook's ``parameters`` cell (what
papermill's ``-p`` replaces) and hands its values to the study's ``units``, whose keyword-only
arguments are named as the notebook's parameters and have no defaults of their own.

Its readers: the orchestrator (``plugin-repro run``: which notebooks, which data), ``gpu-check``,
the grid (``plugin-repro grid``: the units, and the waves' units as notebooks' units with other
parameters), the preflight and ``grid plan`` (the same units priced by ``harness.planning.costs``) and
REPORT.md (``commands.report``: one section per study). None keeps a list of its own, and
``tests/test_studies.py`` fails when one does.

It lives above the layers (``plugin_lib.commands``), as it imports every notebook's module; the
harness never imports upwards (HELM's run specs and lm-evaluation-harness's task registry keep
their declarations apart from the machinery the same way).
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import data
from ..data import sources
from ..harness.profile import REPO_ROOT, Profile

if TYPE_CHECKING:
    from ..harness.grid.units import Unit

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
UnitsOf = Callable[..., list]
ALL_DATA = tuple(data.DATASETS)


@dataclass(frozen=True)
class Study:
    """One notebook's study (module docstring): ``notebook``, its file name without ``.ipynb``;
    ``title``, its REPORT.md section; ``results``, the stems of the tables and figures it writes
    there; ``data``, the data groups it reads (``plugin-repro data check --only``); and either
    ``work`` (the function of ``plugin_lib.experiments`` that gives its grid units, as
    "module.function", imported when asked for: the registry is read by every door, in a fraction
    of a second) or ``in_notebook`` (why its work stays there)."""

    notebook: str
    title: str
    results: tuple[str, ...]
    data: tuple[str, ...]
    work: str = ""
    in_notebook: str = ""

    def __post_init__(self):
        if bool(self.work) == bool(self.in_notebook):
            raise ValueError(f"{self.notebook}: a study declares its units or why its work stays in the notebook.")

    @property
    def units(self) -> UnitsOf | None:
        """The function that gives its units (``work``), or None."""
        if not self.work:
            return None
        module, function = self.work.rsplit(".", 1)
        return getattr(importlib.import_module(f"plugin_lib.experiments.{module}"), function)

    @property
    def path(self) -> Path:
        return NOTEBOOKS_DIR / f"{self.notebook}.ipynb"

    @property
    def prefix(self) -> str:
        """The number its name starts with, as ``--only`` takes it."""
        return self.notebook.split("_", 1)[0]


def _main(notebook: str, title: str, dataset: str) -> Study:
    return Study(notebook, title, (f"main_{dataset}",), (dataset,), "main_tables.units")


STUDIES: tuple[Study, ...] = (
    Study("00_dataset_statistics", "Dataset statistics (Table 7)", ("dataset_statistics",), ALL_DATA,
          in_notebook="counts the data (seconds)"),
    _main("01_table1_e2e", "Main results, E2E NLG (Table 1)", "e2e"),
    _main("02_table2_webnlg", "Main results, WebNLG (Table 2)", "webnlg"),
    _main("03_table3_commongen", "Main results, CommonGen (Table 3)", "commongen"),
    _main("04_table4_adidas", "Main results, Adidas (Table 4)", "adidas"),
    Study("05_table5_bdpl_wrapper", "Plugin as a wrapper: BDPL and BDPL + Plugin (Table 5)", ("table5",), ALL_DATA,
          "table5.units"),
    Study("06_fig2_base_quality", "Base-model quality (Figures 2 and 5)", ("ablation_base_quality",), ("e2e",),
          "base_quality.units"),
    Study("07_fig3_reweighting_complexity", "Reweighting-model complexity (Figures 3 and 6)",
          ("ablation_complexity",), ("e2e",), "ablations.complexity_units"),
    Study("08_fig7_architecture", "Reweighting-model architecture (Figure 7)", ("ablation_architecture",), ("e2e",),
          "ablations.architecture_units"),
    Study("09_adidas_case_study", "Adidas case study (Figures 4 and 8)", ("adidas",), ("adidas", "nltk"),
          in_notebook="reads notebook 04's runs"),
    Study("10_distribution_shift", "Distribution shift (Section 6.4)", ("shift",), ("webnlg", "commongen"),
          "shift.units"),
    Study("11_table8_lora", "Plugin vs LoRA and FLOPs (Table 8)", ("table8",), ALL_DATA, "table8.units"),
    Study("12_topk_logprobs", "Beyond the paper: top-k log-probability APIs", ("topk",), ("e2e",), "topk.units"),
    Study("13_theorem1_convergence", "Theorem 1, measured", ("theorem1",), (),
          in_notebook="a synthetic study on the CPU (minutes)"),
    Study("14_api_model", "Beyond the paper: a model behind an HTTP API", ("api",), ("e2e",),
          in_notebook="a base behind an API server it starts itself"),
    Study("15_proxy_tuning", "Beyond the paper: proxy-tuning and DExperts", ("proxy",), ALL_DATA, "proxy.units"),
)
NOTEBOOKS = tuple(study.notebook for study in STUDIES)
BY_NOTEBOOK = {study.notebook: study for study in STUDIES}


def chosen(only: Sequence[str] = ()) -> list[Study]:
    """The studies whose notebooks start with one of ``only`` (all by default)."""
    found = [s for s in STUDIES if not only or any(s.notebook.startswith(o) for o in only)]
    if not found:
        raise ValueError(f"--only {' '.join(only)} matches no notebook; the notebooks: {', '.join(NOTEBOOKS)}.")
    return found


def data_groups(only: Sequence[str] = ()) -> list[str]:
    """The data groups the chosen studies read, in ``data.sources``' order."""
    wanted = {group for study in chosen(only) for group in study.data}
    return [group for group in sources.GROUPS if group in wanted]


@functools.lru_cache(maxsize=None)
def _parameters_cell(path: Path, mtime_ns: int) -> tuple[tuple[str, object], ...]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    cell = next((c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if cell is None:
        raise ValueError(f"{path.name} has no cell tagged 'parameters'.")
    found = []
    for node in ast.parse("".join(cell["source"])).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.append((node.targets[0].id, ast.literal_eval(node.value)))
    return tuple(found)


def notebook_parameters(study: Study) -> dict[str, object]:
    """The values of the notebook's parameters cell, ``profile`` aside (the caller's)."""
    params = dict(_parameters_cell(study.path, study.path.stat().st_mtime_ns))
    params.pop("profile", None)
    return params


def work_parameters(units: UnitsOf) -> list[str]:
    """The notebook parameters a study's ``units`` takes: its keyword-only arguments."""
    return [p.name for p in inspect.signature(units).parameters.values() if p.kind is p.KEYWORD_ONLY]


def study_units(study: Study | str, profile: Profile, **parameters) -> list[Unit]:
    """The units of ``study`` (or of the notebook so named) when its notebook runs in ``profile``
    with ``parameters`` in place of its parameters cell's (papermill's ``-p``); e.g. a wave's
    units as a notebook's on other datasets."""
    study = BY_NOTEBOOK[study] if isinstance(study, str) else study
    if not study.work:
        raise ValueError(f"{study.notebook}: no units ({study.in_notebook}).")
    defaults = notebook_parameters(study)
    unknown = sorted(set(parameters) - set(defaults))
    if unknown:
        raise ValueError(f"{study.notebook} has no parameter {', '.join(unknown)}; "
                         f"its parameters: {', '.join(defaults)}.")
    given = {**defaults, **parameters}
    lacking = [name for name in work_parameters(study.units) if name not in given]
    if lacking:
        raise ValueError(f"{study.path.name}'s parameters cell lacks {', '.join(lacking)}, which its work "
                         f"({study.work}) takes: restore the notebook from git.")
    return study.units(profile, study.notebook, **{name: given[name] for name in work_parameters(study.units)})


def main_table_notebook(dataset: str) -> str:
    """The main-table notebook that runs on ``dataset``."""
    return next(s.notebook for s in STUDIES
                if s.work == "main_tables.units" and notebook_parameters(s).get("dataset") == dataset)


def notebook_of(units: UnitsOf) -> str:
    """The one notebook whose work ``units`` declares (a wave that reuses a study's units names it so)."""
    (notebook,) = [study.notebook for study in STUDIES if study.work and study.units == units]
    return notebook


def units(profile: Profile, only: Sequence[str] = (), problems: dict[str, str] | None = None
          ) -> list[Unit]:
    """The units of the studies of ``only`` (all by default), one per record, merged across
    notebooks that share it. With ``problems``, a study whose data this machine lacks (e.g. E2E's
    train split, which notebook 06 fine-tunes on, offline) is left out and the reason kept there;
    otherwise the error stops the call."""
    from ..harness.grid import units as grid_units

    found = []
    for study in chosen(only):
        if not study.work:
            continue
        try:
            found += study_units(study, profile)
        except (data.MissingDataError, ValueError) as err:
            if problems is None:
                raise
            problems[study.notebook] = f"not planned here: {err}"
    return grid_units.merge(found)


def notes(only: Sequence[str] = ()) -> dict[str, str]:
    """Each chosen notebook's note for a plan: why its work stays in the notebook, or ''."""
    return {study.notebook: study.in_notebook for study in chosen(only)}
