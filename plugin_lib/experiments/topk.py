"""Notebook 12, beyond the paper: the Plugin over a base seen through a top-k log-probability API.

The views are loaded by name: ``load_base_model("smollm2-135m-instruct@top20")`` (default
rule), ``"...@top20-renormalize"``, or ``"...@topall"`` (every log-probability: the control for
"log-probabilities instead of logits", which matters because the repetition penalty divides a
positive logit but multiplies a log-probability). ``model_spec`` of such a name is the base's
spec with the suffix in its name, so runs are stored under their own folder. The view itself is
``core.blackbox.TopKBlackBox``.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ..core.cache import BaseOutputCache
from ..core.pairs import EncodedPair
from ..harness import grid
from ..harness.models import parse_model_name
from ..harness.profile import Profile, load_profile
from ..metrics import METRIC_NAMES
from ..report import stats, verdicts
from ..report.claims import record_claim

TOPK_RULE = (
    "Beyond the paper. Per top-k view, the Plugin against Zeroshot on the same view. Direction: the Plugin's mean "
    "over seeds is higher on most of the seven metrics. Significant: a paired bootstrap over test inputs per seed "
    f"(Plugin seed k against the deterministic Zeroshot run) gives p < {verdicts.ALPHA} in most seeds on most of "
    f"the {len(stats.BOOTSTRAP_METRICS)} bootstrap metrics ({', '.join(stats.BOOTSTRAP_METRICS)})."
)


def views(base: str, ks: Sequence[int], rule: str, logprob_control: bool = True) -> list[str]:
    """The models notebook 12 runs: the base, its ``@topall`` control, then each top-k view."""
    return [base] + ([f"{base}@topall"] if logprob_control else []) + [f"{base}@top{k}-{rule}" for k in ks]


def units(profile: Profile, notebook: str, *, dataset: str, ks: Sequence[int], rule: str, logprob_control: bool,
          base: str | None, seeds: list[int] | None) -> list[grid.Unit]:
    """The grid's units of notebook 12 with its parameters."""
    profile = load_profile(profile, seeds=seeds)
    names = views(base or profile.base_models[-1], ks, rule, logprob_control)
    return grid.table_units(dataset, profile, notebook, model_names=names, method_names=["Zeroshot", "Plugin"])


def reference_coverage(cache: BaseOutputCache, pairs: Sequence[EncodedPair], ks: Sequence[int]) -> dict[int, float]:
    """Share of the target tokens of ``pairs`` that the base (``cache``, built on the full
    vocabulary) ranks among its top k, for each k: the targets a top-k API would report."""
    hits = np.zeros(len(ks))
    total = 0
    for i, pair in enumerate(pairs):
        rows = cache.get([i]).float()
        targets = torch.tensor(pair.input_ids[pair.prompt_length:], device=rows.device)
        ranks = (rows > rows.gather(1, targets[:, None])).sum(1)  # tokens strictly more likely
        hits += [(ranks < k).sum().item() for k in ks]
        total += len(targets)
    return {k: hits[j] / total for j, k in enumerate(ks)}


# ---------------------------------------------------------------- the ablation's table and figure

FULL_LABEL, ALL_LABEL = "full logits", "all log-probs"


def view_label(model_name: str) -> str:
    """"top-20" for a top-k view, "all log-probs" for ``@topall``, "full logits" for the base."""
    view = parse_model_name(model_name)
    if view is None:
        return FULL_LABEL
    return ALL_LABEL if view[1] is None else f"top-{view[1]}"


def _x_order(label: str) -> tuple[int, int]:
    """Narrowest view first, then all log-probabilities, then the full base (right-most)."""
    if label.startswith("top-"):
        return 0, int(label.removeprefix("top-"))
    return (1, 0) if label == ALL_LABEL else (2, 0)


def plot_metric_vs_k(summary: pd.DataFrame, title: str = ""):
    """One panel per metric: mean (error bars: std over seeds) per view, one line per method,
    views from the narrowest top k to the full base. ``summary`` is ``tables.summarize`` of runs
    whose ``model`` column holds ``view_label``s."""
    import matplotlib.pyplot as plt

    views = sorted(summary.index.unique("model"), key=_x_order)
    fig, axes = plt.subplots(2, 4, figsize=(14, 7))
    for ax, metric in zip(axes.flat, METRIC_NAMES):
        for method, block in summary.groupby(level="method", sort=False):
            block = block.droplevel("method").reindex(views)
            ax.errorbar(range(len(views)), block[metric], yerr=block[f"{metric}_std"].fillna(0),
                        marker="o", capsize=3, label=method)
        ax.set_title(metric)
        ax.set_xticks(range(len(views)), views, rotation=40, ha="right")
    legend_ax = axes.flat[-1]
    legend_ax.axis("off")
    legend_ax.legend(*axes.flat[0].get_legend_handles_labels(), loc="center", title="method")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    plt.close(fig)
    return fig



def plugin_gaps(summary: pd.DataFrame) -> pd.DataFrame:
    """Per view: the Plugin's mean minus Zeroshot's on each metric, and on how many of the
    seven metrics the Plugin is ahead. ``summary`` as for ``plot_metric_vs_k``."""
    views = sorted(summary.index.unique("model"), key=_x_order)
    gaps = pd.DataFrame({metric: [summary.loc[(v, "Plugin"), metric] - summary.loc[(v, "Zeroshot"), metric]
                                  for v in views] for metric in METRIC_NAMES},
                        index=pd.Index(views, name="view"))
    gaps["Plugin ahead on"] = (gaps[list(METRIC_NAMES)] > 0).sum(axis=1)
    return gaps


def record_claims(profile: Profile | str, gaps: pd.DataFrame, dataset: str, rule: str, records: Sequence[dict],
                  n_resamples: int) -> list[dict]:
    """One verdict per top-k view (``TOPK_RULE``): the Plugin still beats Zeroshot.

    Not a claim of the paper (which assumes full logits), but the question a user of a top-k
    API asks: recorded with scope "beyond", tallied apart from the paper's claims.
    ``records``: the runs of every view (their ``model`` is the view's name).
    """
    entries = []
    for view, row in gaps.iterrows():
        if not str(view).startswith("top-"):
            continue
        runs = [r for r in records if view_label(r["model"]) == view]
        comparison = stats.compare_runs([r for r in runs if r["method"] == "Plugin"],
                                        [r for r in runs if r["method"] == "Zeroshot"], n_resamples)
        verdict = verdicts.verdict(verdicts.ahead_on_most(comparison["effect"]),
                                   verdicts.passes_on_most_metrics(comparison["p_per_seed"]))
        ahead = int(row["Plugin ahead on"])
        entries.append(record_claim(
            profile, f"topk_{dataset}_{rule}_{view}",
            f"{dataset}, {view} log-probs ({rule}): the Plugin beats Zeroshot on most metrics",
            "beyond the paper (it assumes full logits)",
            f"Plugin ahead on {ahead}/{len(METRIC_NAMES)}; BLEU gap {row['BLEU']:+.4f}, ROUGE-L gap {row['ROUGE-L']:+.4f}",
            verdict, rule=TOPK_RULE, scope="beyond",
            statistic={"summary": stats.comparison_summary(comparison),
                       "n": {"inputs": comparison["n_inputs"], "seeds": len(comparison["seeds"])},
                       "comparison": comparison}))
    return entries
