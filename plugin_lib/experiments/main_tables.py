"""Notebooks 01-04: the main tables (paper Tables 1-4), ours beside the paper's."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import paper as published
from ..harness.profile import Profile
from ..metrics import METRIC_NAMES
from ..report.claims import majority_verdict, record_claim
from ..report.tables import wins


def paper_comparison(summary: pd.DataFrame, dataset: str, paper_model: str = "LLaMA-3.1-8B") -> pd.DataFrame:
    """Our means next to the paper's for the same methods: cells "ours / paper", and the model
    column says which model is which."""
    paper = published.main_results(dataset)
    paper = paper[paper.model == paper_model].set_index("method")
    rows = []
    for (model, method), row in summary.iterrows():
        cells = {"model (ours / paper)": f"{model} / {paper_model}", "method": method}
        for metric in METRIC_NAMES:
            theirs = paper[metric].get(method, np.nan)
            cells[metric] = f"{row[metric]:.4f} / {theirs:.4f}"
        rows.append(cells)
    return pd.DataFrame(rows)


def record_claims(profile: Profile | str, summary: pd.DataFrame, dataset: str, method: str = "Plugin") -> dict:
    """Check "Plugin outperforms the baselines on nearly all metrics" on our runs and record it."""
    paper = published.main_results(dataset).set_index(["model", "method"])[list(METRIC_NAMES)]
    paper_wins = wins(paper, method)
    ours = wins(summary, method)
    return record_claim(
        profile,
        f"main_{dataset}",
        f"{dataset}: Plugin has the best mean on most of the seven metrics",
        "; ".join(f"{r.model}: {r['best on']}/7" for _, r in paper_wins.iterrows()),
        "; ".join(f"{r.model}: {r['best on']}/7 ({r.metrics or 'none'})" for _, r in ours.iterrows()),
        majority_verdict(int(ours["best on"].min()), len(METRIC_NAMES)),
    )
