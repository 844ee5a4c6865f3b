"""The paper's published numbers, as data files beside this module, and one loader.

| file | what |
| --- | --- |
| ``main_results.csv`` | Tables 1-4: every method's seven metrics per dataset and base model |
| ``table5.csv`` | Table 5: BDPL and BDPL + Plugin |
| ``table7_counts.csv`` | Table 7: rows per dataset split |
| ``table8.csv`` | Table 8: LoRA vs the Plugin |
| ``table8_flops.csv`` | Section 6.5: decoding FLOPs and trainable parameters, GPT2-XL |
| ``shift.csv`` | Section 6.4: the distribution-shift shares before and after the Plugin |

Transcribed from the paper's LaTeX source; nothing here is ever written by a run.
"""
from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

FOLDER = Path(__file__).parent
TABLES = ("main_results", "table5", "table7_counts", "table8", "table8_flops", "shift")


@functools.lru_cache(maxsize=None)
def _read(name: str) -> pd.DataFrame:
    return pd.read_csv(FOLDER / f"{name}.csv")


def table(name: str) -> pd.DataFrame:
    """One of ``TABLES`` as a fresh DataFrame."""
    if name not in TABLES:
        raise ValueError(f"Unknown paper table {name!r}; choose one of {TABLES}.")
    return _read(name).copy()


def main_results(dataset: str | None = None) -> pd.DataFrame:
    """Tables 1-4, optionally one dataset's rows."""
    frame = table("main_results")
    return frame[frame.dataset == dataset] if dataset else frame


def flops() -> dict[str, float]:
    """The paper's GPT2-XL decoding FLOPs and trainable parameters by quantity."""
    frame = table("table8_flops")
    return dict(zip(frame.quantity, frame.value.astype(float)))


def shift(dataset: str) -> tuple[float, float]:
    """The share before (base) and after (Plugin) in the distribution-shift study."""
    row = table("shift").set_index("dataset").loc[dataset]
    return float(row["base"]), float(row["plugin"])
