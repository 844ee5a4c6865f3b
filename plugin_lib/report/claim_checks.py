"""The checks of a notebook's claims: what a ``check_*`` function of an experiment returns (the
claim, its rule, the verdict, our numbers in words and the statistic), the pieces its rules and
statistics share, and how a notebook puts them in a table and in the reproduction report."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..harness.profile import Profile
from . import stats
from .claims import record_claim

# The significance part of a rule that compares two methods' runs.
BOOTSTRAP_RULE = stats.bootstrap_clause("the first")


def check(claim: str, rule: str, verdict: str, ours: str, statistic: dict) -> dict:
    """A check, as every ``check_*`` returns it."""
    return {"claim": claim, "rule": rule, "verdict": verdict, "ours": ours, "statistic": statistic}


def frame(checks: Sequence[dict]) -> pd.DataFrame:
    """The checks of a notebook as a table: claim, verdict, our numbers, statistic."""
    return pd.DataFrame([{"claim": c["claim"], "verdict": c["verdict"], "ours": c["ours"],
                          "statistic": c["statistic"]["summary"]} for c in checks])


def record(profile: Profile | str, checks: Sequence[dict], study: str, dataset: str, paper: str) -> list[dict]:
    """Put the checks of one notebook into the reproduction report, keyed ``<study>_<dataset>_<i>``."""
    return [
        record_claim(profile, f"{study}_{dataset}_{i}", f"{dataset}: {c['claim']}", paper, c["ours"],
                     c["verdict"], rule=c["rule"], statistic=c["statistic"])
        for i, c in enumerate(checks)
    ]


def mean_of(runs: Sequence[dict], metric: str) -> float:
    """The mean of ``metric`` over ``runs`` (run records)."""
    return float(np.mean([r["metrics"][metric] for r in runs]))


def inputs_of(records: Sequence[dict]) -> int | None:
    """Test inputs of the runs (None when the records do not say)."""
    return len(records[0]["test_ids"]) if records and "test_ids" in records[0] else None


def comparison_n(comparisons: Sequence[dict]) -> dict:
    """The test inputs and the most seeds of ``stats.compare_runs`` results."""
    return {"inputs": comparisons[0]["n_inputs"] if comparisons else None,
            "seeds": max((len(c["seeds"]) for c in comparisons), default=None)}


def comparison_statistic(comparison: dict) -> dict:
    """The statistic of a check that rests on one ``stats.compare_runs`` result."""
    return {"summary": stats.comparison_summary(comparison), "n": comparison_n([comparison]), "comparison": comparison}
