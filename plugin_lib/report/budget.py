"""Equal training budget, audited: every trained method stops by the same rules (the epoch cap,
early stopping, the grid), and this module shows where those rules may have held one back.

Two flags per (model, method):

- **still improving at the cap**: a run whose best hyper-validation loss came at its last epoch
  and that last epoch is the profile's ``max_epochs``; more epochs might have helped it.
- **chosen at a grid edge**: the selected value of a hyperparameter is the smallest or largest
  one searched (grids of two or more values), so the search may have stopped short of its
  optimum. ``grid.extend_edges`` pushes such edges (``harness.running.search.select_hparams``); with 0,
  the flag stays.

Beside the first flag, its size: the share of the run's hyper-validation gain (its first epoch's
loss minus its best) made in its last ``patience`` epochs. A plateau that drifts down by noise
shows a share near 0; a run cut off mid-descent, a large one.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from ..data import DATASETS
from ..core import grid_search
from ..harness.running import run_store
from ..harness.profile import Profile, load_profile
from ..utils.io import read_json
from .claims import n_seeds

STILL_IMPROVING = "still improving at the epoch cap"
AT_EDGE = "chosen at a grid edge"


def still_improving(training: dict | None, max_epochs: int) -> bool:
    """Whether a run's best epoch is its last one and that one is the cap."""
    if not training:
        return False
    return training["best_epoch"] == training["epochs_run"] == max_epochs


def late_gain(training: dict | None, patience: int) -> float | None:
    """The share of a run's hyper-validation gain made in its last ``patience`` epochs; None
    without a per-epoch history longer than ``patience``, or with a non-finite loss in it."""
    losses = [epoch["val_loss"] for epoch in (training or {}).get("history", [])]
    if len(losses) <= patience or not all(math.isfinite(loss) for loss in losses):
        return None
    total = losses[0] - min(losses)
    return (min(losses[:-patience]) - min(losses)) / total if total > 0 else 0.0


def searched_grid(profile: Profile, record: dict) -> dict[str, list[float]] | None:
    """The values a trained run's grid search covered: the selection record's own list, or the
    profile's grid for records made before selections stored it; None for untrained methods."""
    if not record.get("training") or not record.get("hparams"):
        return None
    selection = run_store.runs_dir(profile, record["dataset"], record["model"]) / f"{record['method']}-selection.json"
    if selection.exists():
        stored = read_json(selection).get("grid")
        if stored:
            return stored
    return {k: list(getattr(profile.grid, k)) for k in record["hparams"] if hasattr(profile.grid, k)}


def audit(records: list[dict], profile: Profile) -> pd.DataFrame:
    """One row per trained (model, method): seeds still improving at the cap (and the largest
    share of its gain such a seed made in its last ``patience`` epochs, :func:`late_gain`), the
    epochs, and the hyperparameters chosen at a grid edge."""
    rows = {}
    for record in records:
        grid = searched_grid(profile, record)
        if grid is None:
            continue
        key = (record["model"], record["method"])
        row = rows.setdefault(key, {"model": record["model"], "method": record["method"], "seeds": 0,
                                    "still improving at cap": 0, "late gains": [], "best epochs": [],
                                    "cap": profile.training.max_epochs,
                                    "patience": profile.training.patience, "chosen": record["hparams"],
                                    "at grid edge": grid_search.grid_edges(grid, record["hparams"])})
        row["seeds"] += 1
        row["best epochs"].append(record["training"]["best_epoch"])
        if still_improving(record["training"], profile.training.max_epochs):
            row["still improving at cap"] += 1
            row["late gains"].append(late_gain(record["training"], profile.training.patience))
    for row in rows.values():  # the largest, known only when every flagged seed has a history
        gains = row.pop("late gains")
        row["late gain"] = max(gains) if gains and None not in gains else None
    frame = pd.DataFrame(list(rows.values()),
                         columns=["model", "method", "seeds", "still improving at cap", "late gain", "best epochs",
                                  "cap", "patience", "chosen", "at grid edge"])
    frame["late gain"] = frame["late gain"].astype(float)  # NaN where unknown or not flagged
    frame["best epochs"] = frame["best epochs"].map(lambda e: ", ".join(map(str, e)))
    frame["chosen"] = frame["chosen"].map(lambda h: ", ".join(f"{k}={v:g}" for k, v in sorted(h.items())))
    frame["at grid edge"] = frame["at grid edge"].map(lambda keys: ", ".join(keys) or "none")
    return frame


def flags(frame: pd.DataFrame) -> dict[tuple[str, str], list[str]]:
    """(model, method) -> the flags that apply, in words (for claims and captions)."""
    out = {}
    for _, row in frame.iterrows():
        found = []
        if row["still improving at cap"]:
            late = (f", at most {row['late gain']:.1%} of its gain in its last {row['patience']} epochs"
                    if pd.notna(row["late gain"]) else "")
            found.append(f"{STILL_IMPROVING} in {row['still improving at cap']}/{n_seeds(row['seeds'])}{late}")
        if row["at grid edge"] != "none":
            found.append(f"{AT_EDGE} ({row['at grid edge']})")
        if found:
            out[(row["model"], row["method"])] = found
    return out


def summary(frame: pd.DataFrame) -> str:
    """One line for a claim's statistic: which methods carry which flag."""
    found = flags(frame)
    if not found:
        return "no trained method still improving at the epoch cap or chosen at a grid edge"
    return "; ".join(f"{method} ({model}): {', '.join(words)}" for (model, method), words in found.items())


def print_audit(profile: Profile | str, datasets: Sequence[str] = DATASETS) -> None:
    """The audit of ``profile``'s stored runs, per dataset, printed (``plugin-repro report budget``)."""
    profile = load_profile(profile)
    for dataset in datasets:
        frame = audit(run_store.load_runs(profile, dataset), profile)
        print(f"{dataset}:", summary(frame) if len(frame) else "no trained run stored")
        if len(frame):
            print(frame.to_string(index=False, float_format="%.4f"), end="\n\n")
