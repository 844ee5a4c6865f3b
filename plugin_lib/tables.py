"""Result tables assembled from stored runs: mean ± std over seeds, the best value of each
model block in bold and the second underlined, written as CSV (numbers), Markdown and LaTeX;
a paired bootstrap test of Plugin against the best baseline per metric; the paper's numbers
(``paper_results.csv``, transcribed from its Tables 1-4) for side-by-side comparison.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from . import config, data
from .io import atomic_write_text
from .methods import METHODS
from .metrics import METRIC_NAMES, compute_metrics

PAPER_RESULTS = Path(__file__).with_name("paper_results.csv")
# Metrics whose bootstrap recomputation needs no Java process (ROUGE-L, METEOR and CIDEr do).
BOOTSTRAP_METRICS = ("BLEU", "ROUGE-1", "ROUGE-2", "NIST")


def paper_results(dataset: str | None = None) -> pd.DataFrame:
    frame = pd.read_csv(PAPER_RESULTS)
    return frame[frame.dataset == dataset] if dataset else frame


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
    """Strings "mean ± std" with the best of each model block bold and the second underlined."""
    bold, under, pm = {
        "markdown": ("**{}**", "<u>{}</u>", " ± "),
        "latex": (r"\textbf{{{}}}", r"\underline{{{}}}", r"$_{{\pm {}}}$"),
    }[style]
    out = pd.DataFrame(index=summary.index, columns=list(METRIC_NAMES), dtype=object)
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
    return out.reset_index()


def save_results_table(summary: pd.DataFrame, name: str, profile: str, caption: str) -> dict[str, Path]:
    """CSV with the numbers, Markdown and LaTeX with the formatted cells."""
    folder = config.results_dir(profile) / "tables"
    markdown = format_table(summary, "markdown").to_markdown(index=False)
    latex = format_table(summary, "latex").to_latex(index=False, escape=False, caption=caption, label=f"tab:{name}")
    return {
        "csv": atomic_write_text(folder / f"{name}.csv", summary.to_csv()),
        "md": atomic_write_text(folder / f"{name}.md", f"{markdown}\n\n{caption}\n"),
        "tex": atomic_write_text(folder / f"{name}.tex", latex),
    }


def paired_bootstrap(
    predictions_a: Sequence[str],
    predictions_b: Sequence[str],
    references: Sequence[Sequence[str]],
    metrics: Sequence[str] = BOOTSTRAP_METRICS,
    n_resamples: int = 1000,
    seed: int = 0,
) -> dict[str, float]:
    """One-sided p-values that A is not better than B: the share of resamples of the test
    inputs (the same resample for both systems) in which A's corpus score <= B's."""
    rng = np.random.default_rng(seed)
    n = len(references)
    not_better = dict.fromkeys(metrics, 0)
    for _ in range(n_resamples):
        idx = rng.integers(0, n, n)
        refs = [references[i] for i in idx]
        a = compute_metrics([predictions_a[i] for i in idx], refs, metrics)
        b = compute_metrics([predictions_b[i] for i in idx], refs, metrics)
        for metric in metrics:
            not_better[metric] += a[metric] <= b[metric]
    return {metric: (count + 1) / (n_resamples + 1) for metric, count in not_better.items()}


def significance(records: Sequence[dict], n_resamples: int, metrics: Sequence[str] = BOOTSTRAP_METRICS,
                 method: str = "Plugin") -> pd.DataFrame:
    """Plugin vs the best other method (by mean) per model and metric, paired bootstrap per seed.

    The reported p-value is the largest over seeds (Plugin must win in every seed to get a
    small one); the deterministic Zeroshot run is paired with every seed.
    """
    frame = runs_frame(records)
    summary = summarize(frame)
    by_key = {(r["model"], r["method"], r["seed"]): r for r in records}
    rows = []
    for model, block in summary.groupby(level="model", sort=False):
        if (model, method) not in block.index:
            continue
        for metric in metrics:
            others = block.drop(index=(model, method))[metric]
            rival = others.idxmax()[1]
            p_values = []
            for seed in frame[(frame.model == model) & (frame.method == method)].seed:
                ours = by_key[(model, method, seed)]
                theirs = by_key.get((model, rival, seed)) or by_key[(model, rival, frame.seed.min())]
                refs = _references(ours["dataset"], tuple(ours["test_ids"]))
                p_values.append(paired_bootstrap(ours["predictions"], theirs["predictions"], refs,
                                                 [metric], n_resamples, seed)[metric])
            rows.append({"model": model, "metric": metric, "best baseline": rival,
                         method: block.loc[(model, method), metric], "baseline": others.max(),
                         "p (max over seeds)": max(p_values)})
    return pd.DataFrame(rows)


@functools.lru_cache(maxsize=8)
def _references(dataset: str, test_ids: tuple[str, ...]) -> list[list[str]]:
    examples = {ex.id: ex for ex in data.load_dataset(dataset, "test")}
    return [list(examples[i].references) for i in test_ids]


def caption(records: Sequence[dict], title: str) -> str:
    """The table caption, with the scale the numbers were produced at."""
    first = records[0]
    scale = first["scale"]
    models = ", ".join(sorted({r["model"] for r in records}))
    seeds = sorted({r["seed"] for r in records})
    return (f"{title} Profile '{first['profile']}', base {models}; trained on {scale['train_pairs']} pairs "
            f"({scale['train_inputs']} inputs), early stopping on {scale['hyper_inputs']} inputs, tested on "
            f"{scale['test_inputs']} inputs; mean ± std over seeds {seeds} (Zeroshot: one greedy run).")


def paper_comparison(summary: pd.DataFrame, dataset: str, paper_model: str = "LLaMA-3.1-8B") -> pd.DataFrame:
    """Our means next to the paper's for the same methods: cells "ours / paper", and the model
    column says which model is which."""
    paper = paper_results(dataset)
    paper = paper[paper.model == paper_model].set_index("method")
    rows = []
    for (model, method), row in summary.iterrows():
        cells = {"model (ours / paper)": f"{model} / {paper_model}", "method": method}
        for metric in METRIC_NAMES:
            theirs = paper[metric].get(method, np.nan)
            cells[metric] = f"{row[metric]:.4f} / {theirs:.4f}"
        rows.append(cells)
    return pd.DataFrame(rows)


def wins(summary: pd.DataFrame, method: str = "Plugin") -> pd.DataFrame:
    """Per model: on how many of the seven metrics ``method`` has the best mean."""
    rows = []
    for model, block in summary.groupby(level="model", sort=False):
        best = [m for m in METRIC_NAMES if block[m].idxmax()[1] == method]
        rows.append({"model": model, "best on": len(best), "of": len(METRIC_NAMES), "metrics": ", ".join(best)})
    return pd.DataFrame(rows)


def record_main_claim(summary: pd.DataFrame, dataset: str, profile: str, method: str = "Plugin") -> dict:
    """Check "Plugin outperforms the baselines on nearly all metrics" on our runs and record it."""
    from .report import majority_verdict, record_claim

    paper = paper_results(dataset).set_index(["model", "method"])[list(METRIC_NAMES)]
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
