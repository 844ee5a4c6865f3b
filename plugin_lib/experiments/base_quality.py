"""The paper's base-quality ablation (Figures 2 and 5): the Plugin on increasingly fine-tuned bases.

The base is fine-tuned for 0, 1, 2 and 5 epochs (``harness.baselines.finetune``) on a pool of inputs
disjoint from the Plugin's data and from the test split (``harness.baselines.finetune.finetune_pool``),
and Zeroshot and a Plugin run on each. A fine-tuned base is a black box again, with its own run
folder (``finetuned--<its directory name>``). Runs go through ``runner.run_experiment`` like the
main tables; those on the original base are the main table's (shared, not redone).

The sizes and seeds are the profile's ``ablations`` section (``profile.ablation_settings``). The
``check_*`` functions test the paper's claims on the stored runs of notebook 06 under the ``*_RULE``
constants below (exploratory: written after the local numbers, see ``report.preregistered``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .. import data
from ..harness.baselines import finetune
from ..harness import grid
from ..harness.running import runner, search
from ..harness.planning.preflight_counts import count_task
from ..harness.profile import Profile, ablation_seeds, ablation_settings
from ..metrics import METRIC_NAMES
from ..report import claim_checks, stats, tables, verdicts
from ..report.claim_checks import BOOTSTRAP_RULE, comparison_n, inputs_of, mean_of
from ..report.claims import n_seeds


def base_label(epochs: int) -> str:
    """The paper's names: 1FT, 2FT, 5FT; 0FT is the original base."""
    return f"{epochs}FT"


def base_quality_runs(dataset: str, profile: Profile, model_name: str,
                      bases: dict[int, str | finetune.FinetunedBase],
                      seeds: Sequence[int], *, progress: bool = False) -> list[dict]:
    """Zeroshot and Plugin on every base; each record gets its ``finetune_epochs``."""
    arch = search.arch_for(model_name)
    records = []
    for epochs, source in bases.items():
        base = model_name if epochs == 0 else finetune.load_finetuned_base(source, dtype=profile.dtype)
        task = runner.load_task(base, dataset, profile, prompt_model=model_name)
        runs = [runner.run_experiment(task, method, seed, profile, arch=arch if method == "Plugin" else None,
                                      progress=progress) for method, seed in base_quality_jobs(seeds)]
        records += [{**record, "finetune_epochs": epochs} for record in runs]
    return records


def base_quality_jobs(seeds: Sequence[int]) -> list[tuple[str, int]]:
    """The runs of :func:`base_quality_runs` on each base (also the grid's units)."""
    return [("Zeroshot", seeds[0])] + [("Plugin", seed) for seed in seeds]


def units(profile: Profile, notebook: str, *, dataset: str, model: str | None, finetune_epochs: list[int] | None,
          finetune_pool_pairs: int | None, seeds: list[int] | None) -> list[grid.Unit]:
    """The grid's units of notebook 06 with its parameters: each fine-tuned base (continuing from
    the one before it, as ``finetune.finetune_base`` does) and the runs on it."""
    setup = ablation_settings(profile, model=model, finetune_epochs=finetune_epochs,
                              finetune_pool_pairs=finetune_pool_pairs, base_quality_seeds=seeds)
    pool = finetune.finetune_pool(dataset, profile, setup.finetune_pool_pairs)
    bases = finetune.finetuned_bases(setup.model, pool, setup, prompt_style=profile.prompts, tokens=profile.tokens,
                                     records=finetune.records_dir(profile))
    seeds = ablation_seeds(setup, "base_quality", profile)
    arch = search.arch_for(setup.model)
    pair_tokens = count_task(dataset, setup.model, profile).pair_tokens
    pairs = len(data.training_pairs(pool.examples))
    found, before = [], (0, None)
    for epochs, source in bases.items():
        if epochs == 0:  # the original base: its runs are the main table's where the jobs coincide
            jobs = [(m, s, m, None, False) for m, s in base_quality_jobs(seeds)]
            found += grid.task_units(grid.TaskRef(setup.model, dataset), profile, jobs, notebook)
            continue
        tuning = grid.finetune_unit(source, dataset, profile, notebook,
                                    {"finetune_tokens": (epochs - before[0]) * pairs * pair_tokens})
        if before[1] is not None:
            tuning = dataclasses.replace(tuning, needs=(before[1],))
        jobs = [(m, s, m, arch if m == "Plugin" else None, False) for m, s in base_quality_jobs(seeds)]
        found += [tuning] + grid.task_units(grid.finetuned_ref(source, dataset), profile, jobs, notebook,
                                            needs=(tuning.key,))
        before = (epochs, tuning.key)
    return found


def base_quality_frame(records: Sequence[dict]) -> pd.DataFrame:
    """``tables.runs_frame`` with the base named by its fine-tuning epochs (0FT, 1FT, ...)."""
    frame = tables.runs_frame(records)
    frame["model"] = [base_label(r["finetune_epochs"]) for r in records]
    return frame


def finetune_frame(bases: dict[int, str | finetune.FinetunedBase]) -> pd.DataFrame:
    """What each fine-tuned base was trained on, its last training loss and the time it took
    (its kept record: nothing is fine-tuned again where one is there)."""
    rows = []
    for epochs, base in bases.items():
        if epochs == 0:
            continue
        info = base.info()
        rows.append({
            "base": base_label(epochs),
            "pool": info["pool"],
            "pairs": info["pairs"],
            "trainable parameters": info["trainable_parameters"],
            "train loss (last epoch)": info["history"][-1]["train_loss"],
            "seconds (all epochs)": sum(h["seconds"] for h in info["history"]),
        })
    return pd.DataFrame(rows)


def _by_base(summary: pd.DataFrame, method: str, order: Sequence[str]) -> pd.DataFrame:
    return summary.xs(method, level="method").reindex(list(order))


BASE_QUALITY_CLAIM = "Plugin improves as the base improves (Fig. 2)"
BASE_QUALITY_RULE = (
    "Per metric, the fine-tuned base whose own (Zeroshot) score is best; the Plugin on it minus the Plugin on "
    "the original base, seed by seed. Counted on the metrics where that base beats the original base on its "
    "own; if those are not most of the seven, the premise (fine-tuning improves the base) fails: not measurable. "
    "Direction: the mean difference is positive on most of the counted metrics. Significant: the 95% t-interval "
    "over seeds lies above 0 on most of them (one seed gives no interval: at most direction only). Spearman's "
    "rho between the bases' own scores and the Plugin's over the bases is reported exactly and not thresholded."
)
PLUGIN_EVERY_BASE_CLAIM = "Plugin improves on every base (Fig. 5)"
PLUGIN_EVERY_BASE_RULE = (
    "On every base (original and fine-tuned), the Plugin against the base alone (Zeroshot). Direction: the "
    "Plugin's mean over seeds is higher on most of the seven metrics on every base. Significant: on every base, "
    + BOOTSTRAP_RULE + "."
)


def _base_runs(records: Sequence[dict]) -> dict[tuple[str, str], list[dict]]:
    runs: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        runs.setdefault((base_label(record["finetune_epochs"]), record["method"]), []).append(record)
    return runs


def check_base_quality(records: Sequence[dict], order: Sequence[str], metrics: Sequence[str] = METRIC_NAMES) -> dict:
    """Paper: "as the base model's task-specific quality improves, the Plugin's performance
    improves" (``BASE_QUALITY_RULE``). ``records``: ``base_quality_runs``; ``order``: the bases,
    the original one first."""
    runs = _base_runs(records)
    original, tuned = order[0], list(order[1:])
    own = {b: {m: mean_of(runs[(b, "Zeroshot")], m) for m in metrics} for b in order}
    plugin = {b: {r["seed"]: r for r in runs[(b, "Plugin")]} for b in order}
    per_metric, counted = {}, []
    for m in metrics:
        best = max(tuned, key=lambda b: own[b][m])  # the first of equals, in fine-tuning order
        seeds = sorted(set(plugin[best]) & set(plugin[original]))
        diffs = [plugin[best][k]["metrics"][m] - plugin[original][k]["metrics"][m] for k in seeds]
        interval = verdicts.t_interval(diffs)
        improved = own[best][m] > own[original][m]
        counted += [m] if improved else []
        per_metric[m] = {"best base": best, "base improved": improved, "difference per seed": diffs,
                         "mean": interval["mean"], "ci95": [interval["low"], interval["high"]],
                         "spearman rho (exact)": verdicts.format_fraction(verdicts.spearman_exact(
                             [own[b][m] for b in order], [mean_of(list(plugin[b].values()), m) for b in order]))}
    rising = [m for m in counted if per_metric[m]["mean"] > 0]
    above = [m for m in counted if per_metric[m]["ci95"][0] > 0]
    seeds = max(len(d["difference per seed"]) for d in per_metric.values())
    if not verdicts.most(len(counted), len(metrics)):
        verdict = verdicts.NOT_MEASURABLE
    else:
        verdict = verdicts.verdict(verdicts.most(len(rising), len(counted)), verdicts.most(len(above), len(counted)))
    n_inputs = inputs_of(records)
    summary = (f"Plugin(best fine-tuned base) - Plugin(original): BLEU {per_metric[metrics[0]]['mean']:+.4f}; higher on "
               f"{len(rising)}/{len(counted)} metrics where the base improved, CI above 0 on {len(above)}; "
               f"{n_inputs} inputs, {n_seeds(seeds)}")
    ours = ("the base improves with fine-tuning on " f"{len(counted)}/{len(metrics)} metrics; the Plugin on the best "
            "fine-tuned base minus on the original: " + ", ".join(f"{m} {per_metric[m]['mean']:+.4f}" for m in metrics)
            + "; Spearman rho (base's own score, Plugin) over " + ", ".join(order) + ": "
            + ", ".join(f"{m} {per_metric[m]['spearman rho (exact)']}" for m in metrics) + ".")
    return claim_checks.check(BASE_QUALITY_CLAIM, BASE_QUALITY_RULE, verdict, ours,
                              {"summary": summary, "n": {"inputs": n_inputs, "seeds": seeds},
                               "metrics counted": counted, "per metric": per_metric})


def check_plugin_beats_base(records: Sequence[dict], order: Sequence[str], n_resamples: int) -> dict:
    """Paper (Figure 5): the Plugin improves on its base "regardless of the strength of the base
    model" (``PLUGIN_EVERY_BASE_RULE``)."""
    runs = _base_runs(records)
    comparisons = {b: stats.compare_runs(runs[(b, "Plugin")], runs[(b, "Zeroshot")], n_resamples) for b in order}
    ahead = [b for b in order if verdicts.ahead_on_most(comparisons[b]["effect"])]
    significant = [b for b in order if verdicts.passes_on_most_metrics(comparisons[b]["p_per_seed"])]
    verdict = verdicts.verdict(len(ahead) == len(order), len(significant) == len(order))
    ours = ("Plugin minus base alone, BLEU per base: "
            + ", ".join(f"{b} {comparisons[b]['effect']['BLEU']:+.4f}" for b in order)
            + f"; ahead on most metrics on {len(ahead)}/{len(order)} bases, significantly on {len(significant)}.")
    n = comparison_n(list(comparisons.values()))
    summary = (f"ahead on most metrics on {len(ahead)}/{len(order)} bases; p < {verdicts.ALPHA} in most seeds on most "
               f"bootstrap metrics on {len(significant)}/{len(order)}; {n['inputs']} inputs, {n_seeds(n['seeds'])}")
    return claim_checks.check(PLUGIN_EVERY_BASE_CLAIM, PLUGIN_EVERY_BASE_RULE, verdict, ours,
                              {"summary": summary, "n": n, "per base": comparisons})


def base_quality_checks(records: Sequence[dict], order: Sequence[str], n_resamples: int) -> list[dict]:
    """Notebook 06's two checks, in the order of their claim keys."""
    return [check_base_quality(records, order), check_plugin_beats_base(records, order, n_resamples)]


def plot_base_quality(summary: pd.DataFrame, order: Sequence[str], metrics: Sequence[str] = METRIC_NAMES) -> plt.Figure:
    """One panel per metric: the base alone and the Plugin on it, against fine-tuning epochs."""
    fig, axes = plt.subplots(2, 4, figsize=(14, 6.2))
    x = np.arange(len(order))
    for ax, metric in zip(axes.flat, metrics):
        for method, name, marker in (("Zeroshot", "base alone (Zeroshot)", "o"), ("Plugin", "Plugin", "s")):
            rows = _by_base(summary, method, order)
            ax.errorbar(x, rows[metric], yerr=rows[f"{metric}_std"].fillna(0.0), marker=marker, capsize=3, label=name)
        ax.set_xticks(x, order)
        ax.set_title(metric)
    legend_ax = axes.flat[len(metrics)]
    legend_ax.legend(*axes.flat[0].get_legend_handles_labels(), loc="center")
    for ax in axes.flat[len(metrics):]:
        ax.axis("off")
    fig.supxlabel("base fine-tuned for k epochs (kFT; 0FT = original base)")
    fig.tight_layout()
    plt.close(fig)
    return fig
