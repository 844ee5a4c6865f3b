"""Statistics over test inputs: a paired bootstrap of Plugin against the best baseline."""
from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pandas as pd

from .. import data
from ..metrics import compute_metrics
from .tables import runs_frame, summarize

# Metrics whose bootstrap recomputation needs no Java process (ROUGE-L, METEOR and CIDEr do).
BOOTSTRAP_METRICS = ("BLEU", "ROUGE-1", "ROUGE-2", "NIST")


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
