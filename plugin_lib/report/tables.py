"""Result tables assembled from stored runs: mean ± std over seeds, the best value of each
model block in bold and the second underlined, written as CSV (numbers), Markdown and LaTeX.
A summary joined with ``report.stats.input_ci_table`` also shows, beside a metric, its
confidence interval over test inputs (column "<metric> 95% CI").
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..harness.methods import METHODS
from ..harness.profile import Profile
from ..metrics import METRIC_NAMES
from .writer import save_table

# Level of the confidence intervals over test inputs (``report.stats.input_ci``).
CI_LEVEL = 0.95


def runs_frame(records: Sequence[dict]) -> pd.DataFrame:
    """One row per run: model, method, seed and the seven metrics."""
    rows = [{"model": r["model"], "method": r["method"], "seed": r["seed"], **r["metrics"]} for r in records]
    return pd.DataFrame(rows, columns=["model", "method", "seed", *METRIC_NAMES])


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard deviation (ddof=1; NaN for a single seed) per (model, method)."""
    grouped = frame.groupby(["model", "method"], sort=False)[list(METRIC_NAMES)]
    summary = grouped.mean().join(grouped.std(), rsuffix="_std").join(grouped.size().rename("seeds"))
    order = {m: i for i, m in enumerate(METHODS)}
    # The paper's method order; variants (ablation labels) after it, in order of appearance.
    return summary.sort_index(key=lambda idx: idx.map(lambda m: order.get(m, len(order))) if idx.name == "method" else idx,
                              sort_remaining=False, kind="stable")


def _ranks(values: pd.Series) -> pd.Series:
    """1 for the best, 2 for the second best (higher is better for every metric)."""
    return values.rank(ascending=False, method="min")


def format_table(summary: pd.DataFrame, style: str = "markdown", digits: int = 4) -> pd.DataFrame:
    """Strings "mean ± std" with the best of each model block bold and the second underlined;
    "[low, high]" in a column after each metric that has ``<metric>_ci_low``/``_ci_high``."""
    bold, under, pm = {
        "markdown": ("**{}**", "<u>{}</u>", " ± "),
        "latex": (r"\textbf{{{}}}", r"\underline{{{}}}", r"$_{{\pm {}}}$"),
    }[style]
    with_ci = [m for m in METRIC_NAMES if f"{m}_ci_low" in summary.columns]
    columns = [c for m in METRIC_NAMES for c in ([m, ci_column(m, style)] if m in with_ci else [m])]
    out = pd.DataFrame(index=summary.index, columns=columns, dtype=object)
    for model, block in summary.groupby(level="model", sort=False):
        for metric in METRIC_NAMES:
            ranks = _ranks(block[metric])
            for key, row in block.iterrows():
                text = f"{row[metric]:.{digits}f}"
                text = bold.format(text) if ranks[key] == 1 else under.format(text) if ranks[key] == 2 else text
                std = row[f"{metric}_std"]
                if not np.isnan(std):
                    text += pm.format(f"{std:.3f}") if style == "latex" else f"{pm}{std:.3f}"
                out.loc[key, metric] = text
                if metric in with_ci:
                    out.loc[key, ci_column(metric, style)] = (f"[{row[f'{metric}_ci_low']:.{digits}f}, "
                                                       f"{row[f'{metric}_ci_high']:.{digits}f}]")
    return out.reset_index()


def ci_column(metric: str, style: str = "markdown") -> str:
    """The formatted table's column of ``metric``'s confidence interval over test inputs."""
    percent = r"\%" if style == "latex" else "%"
    return f"{metric} {CI_LEVEL * 100:.0f}{percent} CI"


def save_results_table(summary: pd.DataFrame, name: str, profile: Profile | str, caption: str) -> dict[str, Path]:
    """CSV with the numbers, Markdown and LaTeX with the formatted cells."""
    markdown = format_table(summary, "markdown").to_markdown(index=False)
    latex = format_table(summary, "latex").to_latex(index=False, escape=False, caption=caption, label=f"tab:{name}")
    return save_table(summary, name, profile, caption, markdown=f"{markdown}\n\n{caption}\n", latex=latex)


def caption(records: Sequence[dict], title: str) -> str:
    """The table caption, with the scale the numbers were produced at."""
    first = records[0]
    scale = first["scale"]
    models = ", ".join(sorted({r["model"] for r in records}))
    seeds = sorted({r["seed"] for r in records})
    single = ("Zeroshot and TempNet-greedy (equal to Zeroshot by construction): one greedy run each"
              if any(r["method"] == "TempNet-greedy" for r in records) else "Zeroshot: one greedy run")
    return (f"{title} Profile '{first['profile']}', base {models}; trained on {scale['train_pairs']} pairs "
            f"({scale['train_inputs']} inputs), early stopping on {scale['hyper_inputs']} inputs, tested on "
            f"{scale['test_inputs']} inputs; mean ± std over seeds {seeds} ({single}).")


def wins(summary: pd.DataFrame, method: str = "Plugin") -> pd.DataFrame:
    """Per model: on how many of the seven metrics ``method`` has the best mean."""
    rows = []
    for model, block in summary.groupby(level="model", sort=False):
        best = [m for m in METRIC_NAMES if block[m].idxmax()[1] == method]
        rows.append({"model": model, "best on": len(best), "of": len(METRIC_NAMES), "metrics": ", ".join(best)})
    return pd.DataFrame(rows)
