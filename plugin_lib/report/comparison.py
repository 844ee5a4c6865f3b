"""Our runs beside the paper's, per (dataset, base model, method), for tables whose paper
counterpart is another model (Tables 5 and 8): means, stds, the paper's value, counts of the
metrics on which one method beats another, and claims tested on paired runs (``claim_from_runs``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns

from .. import data
from ..harness import models
from ..harness.profile import Profile
from ..metrics import METRIC_NAMES
from . import stats, tables, verdicts
from .claims import n_seeds, record_claim
from .writer import finish_grid

FIGURE_METRICS = ("BLEU", "ROUGE-L", "METEOR")
# "The performance gap is minimal" (Table 8), made testable: within this share of the reference.
MINIMAL_GAP = 0.10


def paper_model(model: str) -> str:
    """The paper's name of a base: its display name, or for a shape twin the model it twins."""
    spec = models.model_spec(model)
    return spec.get("paper_model", spec["display"])


def table_models(profile: Profile, paper: pd.DataFrame) -> list[str]:
    """The profile's base models that the paper's table reports (or twins of them); all of
    them if none is (the offline SmolLM2 of the local and smoke profiles)."""
    listed = set(paper.model)
    chosen = [m for m in profile.base_models if paper_model(m) in listed]
    return chosen or list(profile.base_models)


def paper_counterpart(model: str, paper: pd.DataFrame) -> str:
    """The paper's model to compare a base with: itself if reported, else one of its family."""
    spec = models.model_spec(model)
    listed = list(dict.fromkeys(paper.model))
    if paper_model(model) in listed:
        return paper_model(model)
    family_member = "LLaMA-3.1-8B" if spec["family"] == "llama" else "GPT2-XL"
    return family_member if family_member in listed else listed[0]


def runs_by_dataset(records: list[dict]) -> pd.DataFrame:
    """``tables.runs_frame`` with the dataset of each run."""
    frame = tables.runs_frame(records)
    frame.insert(0, "dataset", [r["dataset"] for r in records])
    return frame


def comparison(records: list[dict], paper: pd.DataFrame, method_order: tuple[str, ...]) -> pd.DataFrame:
    """Per (dataset, model, method): our mean and std over seeds, and the paper's value
    (``<metric>_paper``, from its counterpart model: ``paper_counterpart``)."""
    rows = []
    for dataset in dict.fromkeys(r["dataset"] for r in records):
        summary = tables.summarize(tables.runs_frame([r for r in records if r["dataset"] == dataset]))
        for (model, method), ours in summary.iterrows():
            paper_model = paper_counterpart(model, paper)
            theirs = paper[(paper.dataset == dataset) & (paper.model == paper_model) & (paper.method == method)]
            row = {"dataset": dataset, "model": model, "method": method, "seeds": int(ours["seeds"]),
                   "paper model": paper_model}
            for metric in METRIC_NAMES:
                row[metric] = ours[metric]
                row[f"{metric}_std"] = ours[f"{metric}_std"]
                row[f"{metric}_paper"] = theirs[metric].iloc[0] if len(theirs) else np.nan
            rows.append(row)
    frame = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(method_order)}
    datasets = {d: i for i, d in enumerate(data.DATASETS)}
    key = frame.dataset.map(datasets) * 100 + frame.method.map(lambda m: order.get(m, len(order)))
    return frame.iloc[np.argsort(key.to_numpy(), kind="stable")].reset_index(drop=True)


def format_comparison(frame: pd.DataFrame, digits: int = 4) -> pd.DataFrame:
    """Cells "ours ± std (paper)"; no std for a single run, "–" where the paper has no value."""

    def cell(row, metric):
        text = f"{row[metric]:.{digits}f}"
        if not np.isnan(row[f"{metric}_std"]):
            text += f" ± {row[f'{metric}_std']:.3f}"
        paper = row[f"{metric}_paper"]
        return text + (f" ({paper:.{digits}f})" if not np.isnan(paper) else " (–)")

    out = frame[["dataset", "model", "method", "seeds", "paper model"]].copy()
    for metric in METRIC_NAMES:
        out[metric] = [cell(row, metric) for _, row in frame.iterrows()]
    return out


def comparison_bars(records: list[dict], paper: pd.DataFrame, method_order: tuple[str, ...],
                    metrics=FIGURE_METRICS, title: str = ""):
    """Grouped bars per dataset and method: ours (error bars: std over seeds) above the paper's."""
    ours = runs_by_dataset(records).assign(source="ours")
    datasets = list(dict.fromkeys(ours.dataset))
    models = {m: paper_counterpart(m, paper) for m in ours.model.unique()}
    theirs = paper[paper.dataset.isin(datasets) & paper.model.isin(set(models.values()))
                   & paper.method.isin(ours.method.unique())]
    theirs = theirs.assign(source="paper (" + theirs.model + ")")
    long = pd.concat([ours, theirs], ignore_index=True).melt(
        id_vars=["source", "dataset", "method"], value_vars=list(metrics), var_name="metric")
    hue_order = [m for m in method_order if m in set(long.method)]
    grid = sns.catplot(data=long, x="dataset", y="value", hue="method", hue_order=hue_order, order=datasets,
                       col="metric", row="source", kind="bar", errorbar="sd", sharey=False, height=3.0, aspect=1.3)
    return finish_grid(grid, title)


def _metrics_where(frame: pd.DataFrame, first: str, second: str, holds) -> pd.Series:
    """Per (dataset, model): on how many metrics ``holds(first's value, second's value)``.
    Pairs lacking either method are left out."""
    counts = {}
    for (dataset, model), group in frame.groupby(["dataset", "model"], sort=False):
        rows = group.set_index("method")
        if first in rows.index and second in rows.index:
            counts[(dataset, model)] = sum(bool(holds(rows.at[first, m], rows.at[second, m])) for m in METRIC_NAMES)
    return pd.Series(counts, dtype=int)


def metric_wins(frame: pd.DataFrame, better: str, worse: str) -> pd.Series:
    """Per (dataset, model) of ``frame`` (ours from ``comparison``, or ``paper_rows``): on how many
    metrics ``better``'s value beats ``worse``'s."""
    return _metrics_where(frame, better, worse, lambda a, b: a > b)


def minimal_gaps(frame: pd.DataFrame, method: str = "Plugin", reference: str = "LoRA") -> pd.Series:
    """Per (dataset, model): on how many metrics ``method`` is within MINIMAL_GAP of ``reference``."""
    return _metrics_where(frame, method, reference, lambda a, b: abs(a - b) <= MINIMAL_GAP * abs(b))


def describe_counts(counts: pd.Series) -> str:
    """"e2e (model): 5/7; ..." for per-(dataset, model) metric counts."""
    n = len(METRIC_NAMES)
    return "; ".join(f"{dataset} ({model}): {c}/{n}" for (dataset, model), c in counts.items()) or "not run"


def pairwise_rule(first: str, second: str) -> str:
    """The test of "``first`` beats ``second``" on paired runs (``claim_from_runs``)."""
    return (
        f"Per (dataset, base model), {first} seed k against {second} seed k. Direction: {first}'s mean over seeds is "
        f"higher on most of the seven metrics. Significant: {stats.bootstrap_clause(first)}. Over "
        "datasets: reproduced if most are reproduced, direction only if most show the direction."
    )


def claim_from_runs(profile: Profile | str, key: str, claim: str, records: list[dict], first: str, second: str,
                    paper: pd.Series, n_resamples: int, rule: str) -> dict:
    """``first`` beats ``second`` (``pairwise_rule``) per (dataset, model), from paired runs;
    ``paper``: the paper's metric counts (``metric_wins`` of its rows)."""
    comparisons, verdict_per_pair = {}, []
    for dataset, model in dict.fromkeys((r["dataset"], r["model"]) for r in records):
        runs = [r for r in records if r["dataset"] == dataset and r["model"] == model]
        runs_a, runs_b = [r for r in runs if r["method"] == first], [r for r in runs if r["method"] == second]
        if not runs_a or not runs_b:
            continue
        comparison = stats.compare_runs(runs_a, runs_b, n_resamples)
        comparisons[f"{dataset} ({model})"] = comparison
        verdict_per_pair.append(verdicts.verdict(verdicts.ahead_on_most(comparison["effect"]),
                                                 verdicts.passes_on_most_metrics(comparison["p_per_seed"])))
    if not comparisons:
        return record_claim(profile, key, claim, describe_counts(paper), "not run", verdicts.NOT_MEASURABLE,
                            rule=rule, statistic={"summary": "not run", "n": {"inputs": None, "seeds": None}})
    ours = "; ".join(f"{name}: ahead on {sum(e > 0 for e in c['effect'].values())}/{len(METRIC_NAMES)}, "
                     f"BLEU {c['effect']['BLEU']:+.4f}" for name, c in comparisons.items())
    first_cmp = next(iter(comparisons.values()))
    if len(comparisons) == 1:
        summary = stats.comparison_summary(first_cmp)
    else:
        summary = ("; ".join(f"{name}: {len(c['metrics_significant'])}/{len(c['p_per_seed'])} significant"
                             for name, c in comparisons.items())
                   + f"; {first_cmp['n_inputs']} inputs, {n_seeds(len(first_cmp['seeds']))}")
    return record_claim(profile, key, claim, describe_counts(paper), ours, verdicts.majority_verdict(verdict_per_pair),
                        rule=rule, statistic={"summary": summary, "n": {"inputs": first_cmp["n_inputs"],
                                                                         "seeds": len(first_cmp["seeds"])},
                                              "per dataset": comparisons})
