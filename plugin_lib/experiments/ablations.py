"""The paper's ablations of the Plugin: base-model quality (Figures 2 and 5), complexity of the
reweighting model (Figures 3 and 6) and its architecture (Figure 7).

Every run goes through ``runner.run_experiment``, so it is stored, resumed and scored like the
main tables; runs that equal a main-table run (the original base, the family's 1-layer
reweighting model) share its file instead of being redone.

- Base quality: the base is fine-tuned for 0, 1, 2 and 5 epochs (``harness.finetune``)
  on a pool of inputs disjoint from the Plugin's data and from the test split
  (``harness.finetune.finetune_pool``), and Zeroshot and a Plugin run on each. A fine-tuned base is a
  black box again, with its own run folder (``finetuned--<its directory name>``).
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
``*_RULE`` constants; exploratory: written after the local numbers, see ``report.preregistered``) and return a check: the claim, the rule,
the verdict (``report.verdicts``), our numbers in words and the statistic.
"""
from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .. import data
from ..harness import grid, preflight, runner
from ..harness import finetune
from ..harness.profile import Ablations, Profile
from ..metrics import METRIC_NAMES
from ..report import stats, tables, verdicts
from ..report.claims import n_seeds, record_claim
from ..report.stats import BOOTSTRAP_METRICS
# The reweighting models compared and their runs live in the harness; their names stay importable here.
from ..harness.variants import (ONE_LAYER, PAPER_PRETRAINED, Variant, VariantJob, architecture_variants,  # noqa: F401
                                complexity_variants, one_layer_profile, pretrained_variant, truncated_pretrained,
                                variant_frame, variant_jobs, variant_runs)



def settings(profile: Profile, **overrides) -> Ablations:
    """The ablation sizes of ``profile`` (its ``ablations`` section); overrides that are None
    keep the profile's value, the others are type-checked like any profile field."""
    ablations_section = dataclasses.asdict(profile.ablations)
    unknown = set(overrides) - set(ablations_section)
    if unknown:
        raise ValueError(f"Unknown ablation setting(s) {sorted(unknown)}; known: {sorted(ablations_section)}.")
    ablations_section.update({k: v for k, v in overrides.items() if v is not None})
    return profile.replace(ablations=ablations_section).ablations


def seeds_for(setup: Ablations, ablation: str, profile: Profile) -> list[int]:
    """Seeds of one ablation ("base_quality", "complexity", "architecture")."""
    return list(getattr(setup, f"{ablation}_seeds") or profile.seeds)


def _mean_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per-method rows of a one-model ``tables.summarize`` result."""
    models = summary.index.get_level_values("model").unique()
    if len(models) != 1:
        raise ValueError(f"Expected the runs of one base model, got {list(models)}.")
    return summary.droplevel("model")


_BOOTSTRAP = (f"a paired bootstrap over test inputs per seed (p = share of resamples where the first is not "
              f"better) gives p < {verdicts.ALPHA} in most seeds (more than half) on most of the "
              f"{len(BOOTSTRAP_METRICS)} bootstrap metrics ({', '.join(BOOTSTRAP_METRICS)})")


def record_claims(profile: Profile | str, checks: Sequence[dict], ablation: str, dataset: str, paper: str) -> list[dict]:
    """Put the checks (``check_*`` results) of one notebook into the reproduction report."""
    return [
        record_claim(profile, f"{ablation}_{dataset}_{i}", f"{dataset}: {check['claim']}", paper, check["ours"],
                     check["verdict"], rule=check["rule"], statistic=check["statistic"])
        for i, check in enumerate(checks)
    ]


def claims_frame(checks: Sequence[dict]) -> pd.DataFrame:
    """The checks of a notebook as a table: claim, verdict, our numbers, statistic."""
    return pd.DataFrame([{"claim": c["claim"], "verdict": c["verdict"], "ours": c["ours"],
                          "statistic": c["statistic"]["summary"]} for c in checks])


def _check(claim: str, rule: str, verdict: str, ours: str, statistic: dict) -> dict:
    return {"claim": claim, "rule": rule, "verdict": verdict, "ours": ours, "statistic": statistic}


def _numbers(values: pd.Series) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in values.items())


def _runs(records: Sequence[dict], method: str) -> list[dict]:
    return [r for r in records if r["method"] == method]


def _mean(runs: Sequence[dict], metric: str) -> float:
    return float(np.mean([r["metrics"][metric] for r in runs]))


def _inputs(records: Sequence[dict]) -> int | None:
    """Test inputs of the runs (None when the records do not say)."""
    return len(records[0]["test_ids"]) if records and "test_ids" in records[0] else None


def _n(comparisons: Sequence[dict]) -> dict:
    return {"inputs": comparisons[0]["n_inputs"] if comparisons else None,
            "seeds": max((len(c["seeds"]) for c in comparisons), default=None)}


# ---------------------------------------------------------------- base-model quality


def base_label(epochs: int) -> str:
    """The paper's names: 1FT, 2FT, 5FT; 0FT is the original base."""
    return f"{epochs}FT"


def base_quality_runs(dataset: str, profile: Profile, model_name: str,
                      bases: dict[int, str | finetune.FinetunedBase],
                      seeds: Sequence[int], *, progress: bool = False) -> list[dict]:
    """Zeroshot and Plugin on every base; each record gets its ``finetune_epochs``."""
    arch = runner.arch_for(model_name)
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


def base_quality_units(profile: Profile, notebook: str, dataset: str = "e2e") -> list[grid.Unit]:
    """The grid's units of notebook 06 at the profile's ablation settings: each fine-tuned base
    (continuing from the one before it, as ``finetune.finetune_base`` does) and the runs on it."""
    setup = settings(profile)
    pool = finetune.finetune_pool(dataset, profile, setup.finetune_pool_pairs)
    bases = finetune.finetuned_bases(setup.model, pool, setup, prompt_style=profile.prompts, tokens=profile.tokens,
                                     records=finetune.records_dir(profile))
    seeds = seeds_for(setup, "base_quality", profile)
    arch = runner.arch_for(setup.model)
    pair_tokens = preflight.count_task(dataset, setup.model, profile).pair_tokens
    pairs = len(data.training_pairs(pool.examples))
    units, before = [], (0, None)
    for epochs, source in bases.items():
        if epochs == 0:  # the original base: its runs are the main table's where the jobs coincide
            jobs = [(m, s, m, None, False) for m, s in base_quality_jobs(seeds)]
            units += grid.task_units(grid.TaskRef(setup.model, dataset), profile, jobs, notebook)
            continue
        tuning = grid.finetune_unit(source, dataset, profile, notebook,
                                    {"finetune_tokens": (epochs - before[0]) * pairs * pair_tokens})
        if before[1] is not None:
            tuning = dataclasses.replace(tuning, needs=(before[1],))
        jobs = [(m, s, m, arch if m == "Plugin" else None, False) for m, s in base_quality_jobs(seeds)]
        units += [tuning] + grid.task_units(grid.finetuned_ref(source, dataset), profile, jobs, notebook,
                                            needs=(tuning.key,))
        before = (epochs, tuning.key)
    return units


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
    + _BOOTSTRAP + "."
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
    own = {b: {m: _mean(runs[(b, "Zeroshot")], m) for m in metrics} for b in order}
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
                             [own[b][m] for b in order], [float(np.mean([r["metrics"][m] for r in plugin[b].values()]))
                                                          for b in order]))}
    rising = [m for m in counted if per_metric[m]["mean"] > 0]
    above = [m for m in counted if per_metric[m]["ci95"][0] > 0]
    seeds = max(len(d["difference per seed"]) for d in per_metric.values())
    if not verdicts.most(len(counted), len(metrics)):
        verdict = verdicts.NOT_MEASURABLE
    else:
        verdict = verdicts.verdict(verdicts.most(len(rising), len(counted)), verdicts.most(len(above), len(counted)))
    n_inputs = _inputs(records)
    summary = (f"Plugin(best fine-tuned base) - Plugin(original): BLEU {per_metric[metrics[0]]['mean']:+.4f}; higher on "
               f"{len(rising)}/{len(counted)} metrics where the base improved, CI above 0 on {len(above)}; "
               f"{n_inputs} inputs, {n_seeds(seeds)}")
    ours = ("the base improves with fine-tuning on " f"{len(counted)}/{len(metrics)} metrics; the Plugin on the best "
            "fine-tuned base minus on the original: " + ", ".join(f"{m} {per_metric[m]['mean']:+.4f}" for m in metrics)
            + "; Spearman rho (base's own score, Plugin) over " + ", ".join(order) + ": "
            + ", ".join(f"{m} {per_metric[m]['spearman rho (exact)']}" for m in metrics) + ".")
    return _check(BASE_QUALITY_CLAIM, BASE_QUALITY_RULE, verdict, ours,
                  {"summary": summary, "n": {"inputs": n_inputs, "seeds": seeds}, "metrics counted": counted,
                   "per metric": per_metric})


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
    n = _n(list(comparisons.values()))
    summary = (f"ahead on most metrics on {len(ahead)}/{len(order)} bases; p < {verdicts.ALPHA} in most seeds on most "
               f"bootstrap metrics on {len(significant)}/{len(order)}; {n['inputs']} inputs, {n_seeds(n['seeds'])}")
    return _check(PLUGIN_EVERY_BASE_CLAIM, PLUGIN_EVERY_BASE_RULE, verdict, ours,
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


# ---------------------------------------------------------------- reweighting models


def complexity_units(profile: Profile, notebook: str, dataset: str = "e2e") -> list[grid.Unit]:
    """The grid's units of notebook 07 at the profile's ablation settings."""
    setup = settings(profile)
    variants = complexity_variants(setup.model, setup.layers, setup.pretrained_layers)
    jobs = variant_jobs(variants, seeds_for(setup, "complexity", profile), setup.complexity_hparams)
    return _variant_units(setup.model, dataset, profile, jobs, notebook)


def architecture_units(profile: Profile, notebook: str, dataset: str = "e2e") -> list[grid.Unit]:
    """The grid's units of notebook 08 at the profile's ablation settings."""
    setup = settings(profile)
    jobs = variant_jobs(architecture_variants(setup.model), seeds_for(setup, "architecture", profile))
    return _variant_units(setup.model, dataset, profile, jobs, notebook)


def _variant_units(model: str, dataset: str, profile: Profile, jobs: Sequence[VariantJob], notebook: str
                   ) -> list[grid.Unit]:
    return grid.task_units(grid.TaskRef(model, dataset), profile,
                           [(j.method, j.seed, j.label, j.arch, j.narrow) for j in jobs], notebook)


SINGLE_LAYER_CLAIM = "one layer improves on the base"
SINGLE_LAYER_RULE = (
    "The 1-layer Plugin against the base alone (Zeroshot). Direction: its mean over seeds is higher on most of "
    "the seven metrics. Significant: " + _BOOTSTRAP + "."
)
MORE_LAYERS_CLAIM = "more layers do not help"
MORE_LAYERS_RULE = (
    "Each deeper reweighting model (2, 4, 8, 12 layers) against the 1-layer one: a deeper model beats it if "
    + _BOOTSTRAP + ". Reproduced if none does, not reproduced if one does. A claim of no effect has no "
    "direction to show without a test, so there is no 'direction only'."
)
PRETRAINED_CLAIM = "pretrained initialisation helps"
PRETRAINED_RULE = (
    "Measured only when the pretrained reweighting model had its own learning-rate selection (profile "
    "ablations.complexity_hparams == 'own'); reusing the 1-layer hyperparameters is no fair test of a model "
    "that starts far from the task (not measurable at this scale). Then: the pretrained model against the "
    "1-layer one; direction: higher mean on most of the seven metrics; significant: " + _BOOTSTRAP + "."
)


def _variant_means(records: Sequence[dict], label: str) -> pd.Series:
    return pd.Series({m: _mean(_runs(records, label), m) for m in METRIC_NAMES})


def check_single_layer_gain(records: Sequence[dict], n_resamples: int) -> dict:
    """Paper: "a single-layer reweighting model yields significant improvements over the base"."""
    comparison = stats.compare_runs(_runs(records, ONE_LAYER), _runs(records, "Zeroshot"), n_resamples)
    verdict = verdicts.verdict(verdicts.ahead_on_most(comparison["effect"]),
                               verdicts.passes_on_most_metrics(comparison["p_per_seed"]))
    ours = "1-layer Plugin minus base alone: " + _numbers(pd.Series(comparison["effect"])) + "."
    return _check(SINGLE_LAYER_CLAIM, SINGLE_LAYER_RULE, verdict, ours,
                  {"summary": stats.comparison_summary(comparison), "n": _n([comparison]), "comparison": comparison})


def check_more_layers(records: Sequence[dict], n_resamples: int) -> dict:
    """Paper: more layers give "diminishing returns and slight performance decline"; "a
    single-layer reweighting model yields optimal performance" (``MORE_LAYERS_RULE``)."""
    deeper = list(dict.fromkeys(r["method"] for r in records if re.fullmatch(r"Plugin-\d+L", r["method"])))
    if not deeper:
        return _check(MORE_LAYERS_CLAIM, MORE_LAYERS_RULE, verdicts.NOT_MEASURABLE,
                      "no reweighting model with more than one layer was run",
                      {"summary": "no deeper model run", "n": {"inputs": None, "seeds": None}})
    comparisons = {label: stats.compare_runs(_runs(records, label), _runs(records, ONE_LAYER), n_resamples)
                   for label in deeper}
    winners = [label for label, c in comparisons.items() if verdicts.passes_on_most_metrics(c["p_per_seed"])]
    verdict = verdicts.NOT_REPRODUCED if winners else verdicts.REPRODUCED
    ours = ("deeper minus 1 layer, BLEU: " + ", ".join(f"{label} {c['effect']['BLEU']:+.4f}"
                                                      for label, c in comparisons.items())
            + (f"; significantly better: {', '.join(winners)}." if winners else "; none significantly better."))
    n = _n(list(comparisons.values()))
    summary = (f"{len(winners)}/{len(deeper)} deeper models beat 1 layer (p < {verdicts.ALPHA} in most seeds on most "
               f"bootstrap metrics); {n['inputs']} inputs, {n_seeds(n['seeds'])}")
    return _check(MORE_LAYERS_CLAIM, MORE_LAYERS_RULE, verdict, ours,
                  {"summary": summary, "n": n, "per deeper model": comparisons})


def check_pretrained(records: Sequence[dict], n_resamples: int, hparams: str) -> dict:
    """Paper: "initializing with a pretrained GPT2-Small substantially improves performance"
    (``PRETRAINED_RULE``). ``hparams``: the profile's ``ablations.complexity_hparams``."""
    if not _runs(records, "Plugin-pretrained"):
        return _check(PRETRAINED_CLAIM, PRETRAINED_RULE, verdicts.NOT_MEASURABLE, "no pretrained reweighting model was run",
                      {"summary": "not run", "n": {"inputs": _inputs(records), "seeds": 0}})
    gain = _variant_means(records, "Plugin-pretrained") - _variant_means(records, ONE_LAYER)
    if hparams != "own":
        seeds = len(_runs(records, "Plugin-pretrained"))
        return _check(PRETRAINED_CLAIM, PRETRAINED_RULE, verdicts.NOT_MEASURABLE,
                      f"the pretrained variant reused the 1-layer hyperparameters (complexity_hparams = {hparams!r}) "
                      "instead of its own learning-rate selection, so it is no fair stand-in for the paper's "
                      "GPT2-Small; for the record, pretrained minus 1 layer: " + _numbers(gain[["BLEU", "ROUGE-L"]]) + ".",
                      {"summary": f"not tested: no own learning-rate selection; BLEU {gain['BLEU']:+.4f} (means, "
                                  f"{n_seeds(seeds)})",
                       "n": {"inputs": _inputs(records), "seeds": seeds}, "effect (means)": gain.to_dict()})
    comparison = stats.compare_runs(_runs(records, "Plugin-pretrained"), _runs(records, ONE_LAYER), n_resamples)
    verdict = verdicts.verdict(verdicts.ahead_on_most(comparison["effect"]),
                               verdicts.passes_on_most_metrics(comparison["p_per_seed"]))
    return _check(PRETRAINED_CLAIM, PRETRAINED_RULE, verdict,
                  "pretrained minus 1-layer random init: " + _numbers(pd.Series(comparison["effect"])) + ".",
                  {"summary": stats.comparison_summary(comparison), "n": _n([comparison]), "comparison": comparison})


def complexity_checks(records: Sequence[dict], n_resamples: int, hparams: str) -> list[dict]:
    """Notebook 07's three checks, in the order of their claim keys."""
    return [check_single_layer_gain(records, n_resamples), check_more_layers(records, n_resamples),
            check_pretrained(records, n_resamples, hparams)]


ARCHITECTURE_CLAIM = "transformer has the highest means"
ARCHITECTURE_RULE = (
    "Direction: the transformer layer has the highest mean over seeds on every one of the seven metrics (the "
    "paper: 'across all metrics'). Significant: against the best other architecture by mean on each bootstrap "
    "metric, " + _BOOTSTRAP + "."
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
    n = _n(list(comparisons.values()))
    summary = (f"highest mean on {len(metrics) - len(losing)}/{len(metrics)}; vs the best other: p < {verdicts.ALPHA} "
               f"in most seeds on {len(passing)}/{len(p_per_seed)} bootstrap metrics; {n['inputs']} inputs, "
               f"{n_seeds(n['seeds'])}")
    return _check(ARCHITECTURE_CLAIM, ARCHITECTURE_RULE, verdict, ours,
                  {"summary": summary, "n": n, "p_per_seed": p_per_seed,
                   "best other per bootstrap metric": {m: r for r, ms in rivals.items() for m in ms},
                   "comparisons": comparisons})


def check_architecture_spread(records: Sequence[dict], metrics: Sequence[str] = METRIC_NAMES) -> dict:
    """Paper: the transformer layer has "narrower standard deviation bands" (``SPREAD_RULE``)."""
    labels = [label for label in dict.fromkeys(r["method"] for r in records) if label != "Zeroshot"]
    seeds = min(len(_runs(records, label)) for label in labels)
    if seeds < 2:
        return _check(SPREAD_CLAIM, SPREAD_RULE, verdicts.NOT_MEASURABLE,
                      "the standard deviation needs two or more seeds",
                      {"summary": f"{n_seeds(seeds)}: no standard deviation", "n": {"inputs": _inputs(records), "seeds": seeds}})
    stds = pd.DataFrame({label: {m: float(np.std([r["metrics"][m] for r in _runs(records, label)], ddof=1))
                                 for m in metrics} for label in labels}).T
    narrowest = [m for m in metrics if stds[m].idxmin() == ONE_LAYER]
    direction = verdicts.most(len(narrowest), len(metrics))
    verdict = verdicts.DIRECTION_ONLY if direction else verdicts.NOT_REPRODUCED
    return _check(SPREAD_CLAIM, SPREAD_RULE, verdict,
                  f"the transformer layer has the narrowest std over seeds on {len(narrowest)}/{len(metrics)} "
                  f"metrics ({', '.join(narrowest) or 'none'}).",
                  {"summary": f"narrowest std on {len(narrowest)}/{len(metrics)} metrics; {n_seeds(seeds)}, no test",
                   "n": {"inputs": _inputs(records), "seeds": seeds}, "std per model": stds.to_dict(orient="index")})


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
