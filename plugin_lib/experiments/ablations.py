"""The paper's ablations of the reweighting model: its complexity (Figures 3 and 6) and its
architecture (Figure 7). The base-quality ablation (Figures 2 and 5) is ``experiments.base_quality``.

Every run goes through ``runner.run_experiment``, so it is stored, resumed and scored like the
main tables; runs that equal a main-table run (the family's 1-layer reweighting model) share
its file instead of being redone.

- Complexity: the family's reweighting model with 1 to 12 layers, and a pretrained model of
  the base's vocabulary as initialisation. The paper uses GPT2-Small for GPT2-M. SmolLM2 has
  no smaller public sibling with its vocabulary offline, so the analogue is SmolLM2-135M's own
  public checkpoint cut to its first k blocks, with its own embeddings, final norm and (tied)
  output head (:func:`truncated_pretrained`). Unlike GPT2-Small, which was trained separately
  from GPT2-M, this model shares its weights with the base: it starts as a shallow copy of the
  base itself, so what it adds is mostly a good starting point for the embeddings and the
  lower blocks, not a second opinion; and it needs the base's public weights, which a truly
  closed model would not give.
- Architecture: a transformer layer (the family's default), a two-layer ReLU MLP and a linear
  model on the current token's embedding, same widths (``models.ContextFreeReweighter``).

The sizes per profile are the profile's ``ablations`` section (profiles.yaml). The ``check_*``
functions test the paper's claims on the stored runs of a notebook under the rules below (the
``*_RULE`` constants; exploratory: written after the local numbers, see ``report.preregistered``)
and return a check (``report.claim_checks``): the claim, the rule, the verdict (``report.verdicts``),
our numbers in words and the statistic.
"""
from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..harness import grid
from ..harness.profile import Profile, ablation_seeds, ablation_settings
from ..metrics import METRIC_NAMES
from ..report import claim_checks, stats, verdicts
from ..report.claim_checks import BOOTSTRAP_RULE, comparison_n, comparison_statistic, inputs_of, mean_of
from ..report.claims import n_seeds
from ..report.stats import BOOTSTRAP_METRICS
from ..harness.baselines.variants import (ONE_LAYER, Variant, VariantJob, architecture_variants, complexity_variants,
                                          variant_jobs)


def _mean_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per-method rows of a one-model ``tables.summarize`` result."""
    models = summary.index.get_level_values("model").unique()
    if len(models) != 1:
        raise ValueError(f"Expected the runs of one base model, got {list(models)}.")
    return summary.droplevel("model")


def _numbers(values: pd.Series) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in values.items())


def _runs(records: Sequence[dict], method: str) -> list[dict]:
    return [r for r in records if r["method"] == method]


def complexity_units(profile: Profile, notebook: str, *, dataset: str, model: str | None, layers: list[int] | None,
                     pretrained_layers: int | None, hparams: str | None, seeds: list[int] | None) -> list[grid.Unit]:
    """The grid's units of notebook 07 with its parameters."""
    setup = ablation_settings(profile, model=model, layers=layers, pretrained_layers=pretrained_layers,
                              complexity_hparams=hparams, complexity_seeds=seeds)
    variants = complexity_variants(setup.model, setup.layers, setup.pretrained_layers)
    jobs = variant_jobs(variants, ablation_seeds(setup, "complexity", profile), setup.complexity_hparams)
    return _variant_units(setup.model, dataset, profile, jobs, notebook)


def architecture_units(profile: Profile, notebook: str, *, dataset: str, model: str | None,
                       seeds: list[int] | None) -> list[grid.Unit]:
    """The grid's units of notebook 08 with its parameters."""
    setup = ablation_settings(profile, model=model, architecture_seeds=seeds)
    jobs = variant_jobs(architecture_variants(setup.model), ablation_seeds(setup, "architecture", profile))
    return _variant_units(setup.model, dataset, profile, jobs, notebook)


def _variant_units(model: str, dataset: str, profile: Profile, jobs: Sequence[VariantJob], notebook: str
                   ) -> list[grid.Unit]:
    return grid.task_units(grid.TaskRef(model, dataset), profile,
                           [(j.method, j.seed, j.label, j.arch, j.narrow) for j in jobs], notebook)


SINGLE_LAYER_CLAIM = "one layer improves on the base"
SINGLE_LAYER_RULE = (
    "The 1-layer Plugin against the base alone (Zeroshot). Direction: its mean over seeds is higher on most of "
    "the seven metrics. Significant: " + BOOTSTRAP_RULE + "."
)
MORE_LAYERS_CLAIM = "more layers do not help"
MORE_LAYERS_RULE = (
    "Each deeper reweighting model (2, 4, 8, 12 layers) against the 1-layer one: a deeper model beats it if "
    + BOOTSTRAP_RULE + ". Reproduced if none does, not reproduced if one does. A claim of no effect has no "
    "direction to show without a test, so there is no 'direction only'."
)
PRETRAINED_CLAIM = "pretrained initialisation helps"
PRETRAINED_RULE = (
    "Measured only when the pretrained reweighting model had its own learning-rate selection (profile "
    "ablations.complexity_hparams == 'own'); reusing the 1-layer hyperparameters is no fair test of a model "
    "that starts far from the task (not measurable at this scale). Then: the pretrained model against the "
    "1-layer one; direction: higher mean on most of the seven metrics; significant: " + BOOTSTRAP_RULE + "."
)


def _variant_means(records: Sequence[dict], label: str) -> pd.Series:
    return pd.Series({m: mean_of(_runs(records, label), m) for m in METRIC_NAMES})


def check_single_layer_gain(records: Sequence[dict], n_resamples: int) -> dict:
    """Paper: "a single-layer reweighting model yields significant improvements over the base"."""
    comparison = stats.compare_runs(_runs(records, ONE_LAYER), _runs(records, "Zeroshot"), n_resamples)
    verdict = verdicts.verdict(verdicts.ahead_on_most(comparison["effect"]),
                               verdicts.passes_on_most_metrics(comparison["p_per_seed"]))
    ours = "1-layer Plugin minus base alone: " + _numbers(pd.Series(comparison["effect"])) + "."
    return claim_checks.check(SINGLE_LAYER_CLAIM, SINGLE_LAYER_RULE, verdict, ours,
                              comparison_statistic(comparison))


def check_more_layers(records: Sequence[dict], n_resamples: int) -> dict:
    """Paper: more layers give "diminishing returns and slight performance decline"; "a
    single-layer reweighting model yields optimal performance" (``MORE_LAYERS_RULE``)."""
    deeper = list(dict.fromkeys(r["method"] for r in records if re.fullmatch(r"Plugin-\d+L", r["method"])))
    if not deeper:
        return claim_checks.check(MORE_LAYERS_CLAIM, MORE_LAYERS_RULE, verdicts.NOT_MEASURABLE,
                                  "no reweighting model with more than one layer was run",
                                  {"summary": "no deeper model run", "n": {"inputs": None, "seeds": None}})
    comparisons = {label: stats.compare_runs(_runs(records, label), _runs(records, ONE_LAYER), n_resamples)
                   for label in deeper}
    winners = [label for label, c in comparisons.items() if verdicts.passes_on_most_metrics(c["p_per_seed"])]
    verdict = verdicts.NOT_REPRODUCED if winners else verdicts.REPRODUCED
    ours = ("deeper minus 1 layer, BLEU: " + ", ".join(f"{label} {c['effect']['BLEU']:+.4f}"
                                                      for label, c in comparisons.items())
            + (f"; significantly better: {', '.join(winners)}." if winners else "; none significantly better."))
    n = comparison_n(list(comparisons.values()))
    summary = (f"{len(winners)}/{len(deeper)} deeper models beat 1 layer (p < {verdicts.ALPHA} in most seeds on most "
               f"bootstrap metrics); {n['inputs']} inputs, {n_seeds(n['seeds'])}")
    return claim_checks.check(MORE_LAYERS_CLAIM, MORE_LAYERS_RULE, verdict, ours,
                              {"summary": summary, "n": n, "per deeper model": comparisons})


def check_pretrained(records: Sequence[dict], n_resamples: int, hparams: str) -> dict:
    """Paper: "initializing with a pretrained GPT2-Small substantially improves performance"
    (``PRETRAINED_RULE``). ``hparams``: the profile's ``ablations.complexity_hparams``."""
    if not _runs(records, "Plugin-pretrained"):
        return claim_checks.check(PRETRAINED_CLAIM, PRETRAINED_RULE, verdicts.NOT_MEASURABLE,
                                  "no pretrained reweighting model was run",
                                  {"summary": "not run", "n": {"inputs": inputs_of(records), "seeds": 0}})
    gain = _variant_means(records, "Plugin-pretrained") - _variant_means(records, ONE_LAYER)
    if hparams != "own":
        seeds = len(_runs(records, "Plugin-pretrained"))
        ours = (f"the pretrained variant reused the 1-layer hyperparameters (complexity_hparams = {hparams!r}) "
                "instead of its own learning-rate selection, so it is no fair stand-in for the paper's "
                "GPT2-Small; for the record, pretrained minus 1 layer: " + _numbers(gain[["BLEU", "ROUGE-L"]]) + ".")
        summary = f"not tested: no own learning-rate selection; BLEU {gain['BLEU']:+.4f} (means, {n_seeds(seeds)})"
        return claim_checks.check(PRETRAINED_CLAIM, PRETRAINED_RULE, verdicts.NOT_MEASURABLE, ours,
                                  {"summary": summary, "n": {"inputs": inputs_of(records), "seeds": seeds},
                                   "effect (means)": gain.to_dict()})
    comparison = stats.compare_runs(_runs(records, "Plugin-pretrained"), _runs(records, ONE_LAYER), n_resamples)
    verdict = verdicts.verdict(verdicts.ahead_on_most(comparison["effect"]),
                               verdicts.passes_on_most_metrics(comparison["p_per_seed"]))
    ours = "pretrained minus 1-layer random init: " + _numbers(pd.Series(comparison["effect"])) + "."
    return claim_checks.check(PRETRAINED_CLAIM, PRETRAINED_RULE, verdict, ours, comparison_statistic(comparison))


def complexity_checks(records: Sequence[dict], n_resamples: int, hparams: str) -> list[dict]:
    """Notebook 07's three checks, in the order of their claim keys."""
    return [check_single_layer_gain(records, n_resamples), check_more_layers(records, n_resamples),
            check_pretrained(records, n_resamples, hparams)]


ARCHITECTURE_CLAIM = "transformer has the highest means"
ARCHITECTURE_RULE = (
    "Direction: the transformer layer has the highest mean over seeds on every one of the seven metrics (the "
    "paper: 'across all metrics'). Significant: against the best other architecture by mean on each bootstrap "
    "metric, " + BOOTSTRAP_RULE + "."
)
SPREAD_CLAIM = "transformer has the narrowest bands"
SPREAD_RULE = (
    "The transformer layer has the smallest standard deviation over seeds on most of the seven metrics. No test: "
    "comparing variances from a few seeds has no power, so the verdict is at most 'direction only'; one seed has "
    "no standard deviation (not measurable)."
)


def check_architecture(records: Sequence[dict], n_resamples: int, metrics: Sequence[str] = METRIC_NAMES) -> dict:
    """Paper: the transformer layer "consistently outperforms both the MLP and linear layers
    across all metrics" (``ARCHITECTURE_RULE``)."""
    labels = [label for label in dict.fromkeys(r["method"] for r in records) if label != "Zeroshot"]
    means = pd.DataFrame({label: _variant_means(records, label) for label in labels}).T
    best = means[list(metrics)].idxmax()
    losing = {m: best[m] for m in metrics if best[m] != ONE_LAYER}
    rivals: dict[str, list[str]] = {}
    for metric in BOOTSTRAP_METRICS:
        rival = means.drop(index=ONE_LAYER)[metric].idxmax()
        rivals.setdefault(rival, []).append(metric)
    p_per_seed, comparisons = {}, {}
    for rival, chosen in rivals.items():
        comparisons[rival] = stats.compare_runs(_runs(records, ONE_LAYER), _runs(records, rival), n_resamples, chosen)
        p_per_seed.update(comparisons[rival]["p_per_seed"])
    p_per_seed = {m: p_per_seed[m] for m in BOOTSTRAP_METRICS}
    passing = verdicts.metrics_passing(p_per_seed)
    verdict = verdicts.verdict(not losing, verdicts.most(len(passing), len(p_per_seed)))
    ours = (f"the transformer layer has the highest mean on {len(metrics) - len(losing)}/{len(metrics)} metrics"
            + (" (best elsewhere: " + ", ".join(f"{m} {v}" for m, v in losing.items()) + ")" if losing else "")
            + "; means per model: "
            + "; ".join(f"{label}: " + _numbers(means.loc[label, list(metrics)]) for label in means.index) + ".")
    n = comparison_n(list(comparisons.values()))
    summary = (f"highest mean on {len(metrics) - len(losing)}/{len(metrics)}; vs the best other: p < {verdicts.ALPHA} "
               f"in most seeds on {len(passing)}/{len(p_per_seed)} bootstrap metrics; {n['inputs']} inputs, "
               f"{n_seeds(n['seeds'])}")
    return claim_checks.check(ARCHITECTURE_CLAIM, ARCHITECTURE_RULE, verdict, ours,
                              {"summary": summary, "n": n, "p_per_seed": p_per_seed,
                               "best other per bootstrap metric": {m: r for r, ms in rivals.items() for m in ms},
                               "comparisons": comparisons})


def check_architecture_spread(records: Sequence[dict], metrics: Sequence[str] = METRIC_NAMES) -> dict:
    """Paper: the transformer layer has "narrower standard deviation bands" (``SPREAD_RULE``)."""
    labels = [label for label in dict.fromkeys(r["method"] for r in records) if label != "Zeroshot"]
    seeds = min(len(_runs(records, label)) for label in labels)
    if seeds < 2:
        return claim_checks.check(SPREAD_CLAIM, SPREAD_RULE, verdicts.NOT_MEASURABLE,
                                  "the standard deviation needs two or more seeds",
                                  {"summary": f"{n_seeds(seeds)}: no standard deviation",
                                   "n": {"inputs": inputs_of(records), "seeds": seeds}})
    stds = pd.DataFrame({label: {m: float(np.std([r["metrics"][m] for r in _runs(records, label)], ddof=1))
                                 for m in metrics} for label in labels}).T
    narrowest = [m for m in metrics if stds[m].idxmin() == ONE_LAYER]
    direction = verdicts.most(len(narrowest), len(metrics))
    verdict = verdicts.DIRECTION_ONLY if direction else verdicts.NOT_REPRODUCED
    ours = (f"the transformer layer has the narrowest std over seeds on {len(narrowest)}/{len(metrics)} "
            f"metrics ({', '.join(narrowest) or 'none'}).")
    summary = f"narrowest std on {len(narrowest)}/{len(metrics)} metrics; {n_seeds(seeds)}, no test"
    return claim_checks.check(SPREAD_CLAIM, SPREAD_RULE, verdict, ours,
                              {"summary": summary, "n": {"inputs": inputs_of(records), "seeds": seeds},
                               "std per model": stds.to_dict(orient="index")})


def architecture_checks(records: Sequence[dict], n_resamples: int) -> list[dict]:
    """Notebook 08's two checks, in the order of their claim keys."""
    return [check_architecture(records, n_resamples), check_architecture_spread(records)]


def plot_complexity(summary: pd.DataFrame, variants: Sequence[Variant],
                    metrics: Sequence[str] = ("BLEU", "ROUGE-L")) -> plt.Figure:
    """Bars per reweighting model (std over seeds as error bars); dashed: the base alone."""
    means = _mean_table(summary)
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(5.5, 1.1 * len(variants)) * len(metrics), 4.2))
    x = np.arange(len(variants))
    colors = ["C0" if v.arch is None or v.arch.get("arch") != "pretrained" else "C2" for v in variants]
    for ax, metric in zip(np.atleast_1d(axes), metrics):
        rows = means.loc[[v.label for v in variants]]
        ax.bar(x, rows[metric], yerr=rows[f"{metric}_std"].fillna(0.0), color=colors, capsize=3)
        ax.axhline(means.loc["Zeroshot", metric], ls="--", color="black", label="base alone (Zeroshot)")
        ax.set_xticks(x, [textwrap.fill(v.name, 12) for v in variants])
        ax.set_title(metric)
        ax.legend(loc="lower right")
    fig.supxlabel("reweighting model")
    fig.tight_layout()
    plt.close(fig)
    return fig


def plot_architecture(summary: pd.DataFrame, variants: Sequence[Variant]) -> plt.Figure:
    """Mean per metric with a mean ± std band per reweighting architecture; 0-1 metrics on the
    left, CIDEr and NIST (other scales) on the right."""
    means = _mean_table(summary)
    groups = (("BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "METEOR"), ("CIDEr", "NIST"))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [5, 2.2]})
    for ax, metrics in zip(axes, groups):
        x = np.arange(len(metrics))
        for variant in variants:
            mean = means.loc[variant.label, list(metrics)].to_numpy(float)
            std = np.nan_to_num(means.loc[variant.label, [f"{m}_std" for m in metrics]].to_numpy(float))
            ax.plot(x, mean, marker="o", label=variant.name)
            ax.fill_between(x, mean - std, mean + std, alpha=0.25)
        ax.set_xticks(x, metrics)
    axes[0].set_title("mean over seeds, band: ± std")
    axes[1].set_title("CIDEr-D and NIST (other scales)")
    axes[0].legend()
    fig.tight_layout()
    plt.close(fig)
    return fig
