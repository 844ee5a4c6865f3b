"""Notebook 00: dataset statistics, ours beside the paper's Table 7."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from .. import paper as published
from ..data import ALL_SPLITS, DATASETS, SPLITS, MissingDataError, load_dataset, loader_warnings, training_pairs


def rows_for(rows: int | Mapping[str, int | None] | None, split: str) -> int | None:
    """The subset size of one split, from an int or a per-split mapping."""
    return rows.get(split) if isinstance(rows, Mapping) else rows


def count_note(ours: int, paper: int | None) -> str:
    """How our row count compares with the paper's."""
    if paper is None:
        return ""
    return "matches the paper" if ours == paper else f"{ours - paper:+,} rows vs the paper"


def paper_count(name: str, split: str) -> int | None:
    """The paper's row count (Table 7) of a split; None where the paper has no such split."""
    table = published.table("table7_counts")
    value = table[(table.dataset == name) & (table.split == split)]["rows"]
    return None if value.empty or pd.isna(value.iloc[0]) else int(value.iloc[0])


def statistics_row(name: str, split: str,
                   rows: int | Mapping[str, int | None] | None) -> dict[str, Any]:
    """One line of :func:`dataset_statistics`; loader warnings become part of the note.

    Only a missing *train* file becomes a "not available" note (the E2E train split is not in
    the reference data; the paper uses it only for ablations). A missing validation or test
    file raises: a table of NAs is no result, and must not replace one."""
    paper = paper_count(name, split)
    row = {"dataset": name, "split": split, "paper_rows": paper, "rows": pd.NA,
           "unique_inputs": pd.NA, "note": ""}
    if split not in SPLITS[name]:
        return {**row, "note": "no such split (the paper has none)"}
    try:
        with loader_warnings() as caught:
            examples = load_dataset(name, split, rows=rows_for(rows, split))
    except MissingDataError as err:
        if split != "train":
            raise
        return {**row, "note": f"not available ({err.relpath} missing)"}
    pairs = len(training_pairs(examples))
    notes = [count_note(pairs, paper) if rows is None else "subset"]
    notes += [str(w.message) for w in caught]
    return {**row, "rows": pairs, "unique_inputs": len(examples),
            "note": "; ".join(n for n in notes if n)}


def dataset_statistics(rows: int | Mapping[str, int | None] | None = None) -> pd.DataFrame:
    """Per dataset and split: the paper's row count, ours (pairs), our unique inputs, a note.

    ``rows`` (an int, or a profile's ``rows`` mapping per split) counts seeded subsets instead
    of whole splits. A train split that is not available shows NA with a note; a missing
    validation or test file raises MissingDataError.
    """
    table = pd.DataFrame([statistics_row(name, split, rows)
                          for name in DATASETS for split in ALL_SPLITS])
    for column in ("paper_rows", "rows", "unique_inputs"):
        table[column] = table[column].astype("Int64")
    return table
