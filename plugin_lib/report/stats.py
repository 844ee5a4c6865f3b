"""Statistics over test inputs: a paired bootstrap of one system against another, seed by seed
(``compare_runs``), and of the Plugin against the best baseline of a main table (``significance``);
confidence intervals over test inputs for a system's corpus metrics (``input_ci``)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..harness.running import record_scores
from ..metrics import METRIC_NAMES
from ..metrics.resample import InputStatistics, resample_counts
from . import verdicts
from .claims import n_seeds
from .tables import CI_LEVEL, runs_frame, summarize

# Metrics whose bootstrap recomputation needs no Java process (ROUGE-L, METEOR and CIDEr do).
BOOTSTRAP_METRICS = ("BLEU", "ROUGE-1", "ROUGE-2", "NIST")


def bootstrap_clause(first: str) -> str:
    """The significance part of a rule that compares ``first``'s runs with another's, one text
    for every such rule."""
    return (f"a paired bootstrap over test inputs per seed (p = share of resamples where {first} is not better) "
            f"gives p < {verdicts.ALPHA} in most seeds (more than half) on most of the {len(BOOTSTRAP_METRICS)} "
            f"bootstrap metrics ({', '.join(BOOTSTRAP_METRICS)})")


# The main tables' confidence intervals over test inputs: three metrics of different kinds
# (n-gram precision, longest common subsequence, information-weighted n-grams) that a draw of
# the inputs rescores exactly from per-input statistics. METEOR (one Java exchange per draw)
# and CIDEr-D (its idf comes from the drawn corpus's references) get none.
CI_METRICS = ("BLEU", "ROUGE-L", "NIST")


def paired_bootstrap(
    predictions_a: Sequence[str],
    predictions_b: Sequence[str],
    references: Sequence[Sequence[str]],
    metrics: Sequence[str] = BOOTSTRAP_METRICS,
    n_resamples: int = 1000,
    seed: int = 0,
) -> dict[str, float]:
    """One-sided p-values that A is not better than B: the share of resamples of the test
    inputs (the same resample for both systems) in which A's corpus score <= B's.

    Each drawn corpus is scored from per-input statistics (``metrics.resample``: equal to
    ``compute_metrics`` on the drawn corpus), not by re-reading the texts for every draw."""
    counts = resample_counts(len(references), n_resamples, seed)
    a = InputStatistics(predictions_a, references, metrics).scores(counts)
    b = InputStatistics(predictions_b, references, metrics).scores(counts)
    return {metric: (int((a[metric] <= b[metric]).sum()) + 1) / (n_resamples + 1) for metric in metrics}


def significance(records: Sequence[dict], n_resamples: int, metrics: Sequence[str] = BOOTSTRAP_METRICS,
                 method: str = "Plugin") -> pd.DataFrame:
    """Plugin vs the best other method (by mean) per model and metric, paired bootstrap per seed.

    ``p per seed`` holds the one-sided p-value of every seed (in the order of ``seeds``);
    ``p (max over seeds)`` is the largest (Plugin must win in every seed to get a small one).
    The deterministic Zeroshot run is paired with every seed; ``n inputs``: test inputs.
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
            seeds = [int(s) for s in frame[(frame.model == model) & (frame.method == method)].seed]
            p_values = []
            for seed in seeds:
                ours = by_key[(model, method, seed)]
                theirs = by_key.get((model, rival, seed)) or by_key[(model, rival, frame.seed.min())]
                refs = _references(ours["dataset"], tuple(ours["test_ids"]))
                p_values.append(paired_bootstrap(ours["predictions"], theirs["predictions"], refs,
                                                 [metric], n_resamples, seed)[metric])
            rows.append({"model": model, "metric": metric, "best baseline": rival,
                         method: block.loc[(model, method), metric], "baseline": others.max(),
                         "p (max over seeds)": max(p_values), "p per seed": tuple(p_values),
                         "seeds": tuple(seeds), "n inputs": len(by_key[(model, method, seeds[0])]["test_ids"])})
    return pd.DataFrame(rows)


def pair_by_seed(runs_a: Sequence[dict], runs_b: Sequence[dict]) -> list[tuple[dict, dict]]:
    """(A's run, B's run of the same seed) for every seed both have, in seed order. A B with a
    single run (a deterministic method such as Zeroshot) is paired with every seed of A. The
    paired runs must be on the same test inputs, in the same order."""
    if not runs_a or not runs_b:
        raise ValueError("pair_by_seed needs runs of both systems.")
    by_seed = {r["seed"]: r for r in runs_b}
    single = runs_b[0] if len(runs_b) == 1 else None
    pairs = [(run, by_seed.get(run["seed"]) or single) for run in sorted(runs_a, key=lambda r: r["seed"])]
    pairs = [(run, other) for run, other in pairs if other is not None]
    if not pairs:
        raise ValueError(f"No seed in common: {sorted(r['seed'] for r in runs_a)} and {sorted(by_seed)}.")
    for run, other in pairs:
        if list(run["test_ids"]) != list(other["test_ids"]):
            raise ValueError(f"Seed {run['seed']}: the two runs are not on the same test inputs.")
    return pairs


def compare_runs(runs_a: Sequence[dict], runs_b: Sequence[dict], n_resamples: int,
                 metrics: Sequence[str] = BOOTSTRAP_METRICS) -> dict:
    """A against B, seed by seed (``pair_by_seed``): the effect (A's mean minus B's over the
    paired runs, on each of the seven metrics, from the stored scores) and, per bootstrap
    metric, the one-sided paired-bootstrap p-value of each seed (``paired_bootstrap``, the run's
    seed as the resampling seed). JSON-ready: the ``statistic`` of a claim record."""
    pairs = pair_by_seed(runs_a, runs_b)
    p_per_seed: dict[str, list[float]] = {m: [] for m in metrics}
    for run, other in pairs:
        refs = _references(run["dataset"], tuple(run["test_ids"]))
        p = paired_bootstrap(run["predictions"], other["predictions"], refs, metrics, n_resamples, run["seed"])
        for metric in metrics:
            p_per_seed[metric].append(float(p[metric]))
    used_b = list({id(other): other for _, other in pairs}.values())
    effect = {m: float(np.mean([run["metrics"][m] for run, _ in pairs]) - np.mean([r["metrics"][m] for r in used_b]))
              for m in METRIC_NAMES}
    return {"effect": effect, "p_per_seed": p_per_seed, "seeds": [int(run["seed"]) for run, _ in pairs],
            "n_inputs": len(pairs[0][0]["test_ids"]), "bootstrap_resamples": int(n_resamples),
            "metrics_significant": verdicts.metrics_passing(p_per_seed)}


def comparison_summary(comparison: dict, metric: str = "BLEU") -> str:
    """One line: the effect on ``metric``, its p-values, and on how many bootstrap metrics the
    test passes in most seeds, with n."""
    ps = "/".join(f"{p:.3f}" for p in comparison["p_per_seed"].get(metric, []))
    return (f"{metric} {comparison['effect'][metric]:+.4f} (p {ps}); p < {verdicts.ALPHA} in most seeds on "
            f"{len(comparison['metrics_significant'])}/{len(comparison['p_per_seed'])} bootstrap metrics; "
            f"{comparison['n_inputs']} inputs, {n_seeds(len(comparison['seeds']))}")


def _references(dataset: str, test_ids: tuple[str, ...]) -> list[list[str]]:
    by_id = record_scores.references_by_id(dataset)
    return [by_id[i] for i in test_ids]


def input_ci(runs: Sequence[dict], references: Sequence[Sequence[str]], n_resamples: int,
             metrics: Sequence[str] = CI_METRICS, seed: int = 0, level: float = CI_LEVEL
             ) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap interval over test inputs for one system's corpus metrics.

    ``runs``: the system's runs (one per seed), each with ``predictions`` for the same test
    inputs, in the order of ``references``. Each of ``n_resamples`` draws picks the inputs with
    replacement (seeded by ``seed``; the same draws for every run, so systems scored with the
    same seed share them), rescores each run's corpus metric on the drawn inputs
    (``metrics.resample``: equal to ``compute_metrics`` on that corpus) and averages over the
    runs. The interval holds the central ``level`` share of those means: the uncertainty that
    comes from which test inputs were used, for the mean over seeds shown beside it.
    """
    if not runs:
        raise ValueError("input_ci needs at least one run.")
    for run in runs:
        if len(run["predictions"]) != len(references):
            raise ValueError(f"A run has {len(run['predictions'])} predictions for {len(references)} inputs.")
    counts = resample_counts(len(references), n_resamples, seed)
    per_run = [InputStatistics(run["predictions"], references, metrics).scores(counts) for run in runs]
    tail = (1 - level) / 2 * 100
    return {m: tuple(float(q) for q in np.percentile(np.mean([s[m] for s in per_run], axis=0), [tail, 100 - tail]))
            for m in per_run[0]}


def input_ci_table(records: Sequence[dict], n_resamples: int, metrics: Sequence[str] = CI_METRICS,
                   seed: int = 0) -> pd.DataFrame:
    """``input_ci`` (level ``CI_LEVEL``) of every (model, method) of ``records`` (its runs over seeds must share their
    test inputs): columns ``<metric>_ci_low`` and ``<metric>_ci_high``, indexed like
    ``tables.summarize``, so that it joins the summary."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        groups.setdefault((record["model"], record["method"]), []).append(record)
    rows = []
    for (model, method), runs in groups.items():
        test_ids = list(runs[0]["test_ids"])
        if any(list(run["test_ids"]) != test_ids for run in runs):
            raise ValueError(f"{model} / {method}: its runs are not on the same test inputs.")
        refs = _references(runs[0]["dataset"], tuple(test_ids))
        interval = input_ci(runs, refs, n_resamples, metrics, seed)
        rows.append({"model": model, "method": method,
                     **{f"{m}_ci_{end}": v for m, (low, high) in interval.items()
                        for end, v in (("low", low), ("high", high))}})
    return pd.DataFrame(rows).set_index(["model", "method"])


def input_ci_caption(records: Sequence[dict], n_resamples: int, metrics: Sequence[str] = CI_METRICS) -> str:
    """The sentence a table with ``input_ci_table`` columns needs in its caption."""
    n_inputs = len(records[0]["test_ids"])
    return (f"{CI_LEVEL:.0%} CI: percentile bootstrap over the {n_inputs} test inputs ({n_resamples} draws with "
            f"replacement, the same draws for every seed and method; metric averaged over seeds per draw), "
            f"for {', '.join(metrics)} only.")
