"""Notebooks 01-04: the main tables (paper Tables 1-4), ours beside the paper's."""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from .. import paper as published
from ..harness import grid, methods, tasks
from ..harness.running import run_store, runner
from ..harness.machine import results_dir
from ..harness.profile import Profile, load_profile
from ..harness.baselines.tempnet import FixedTemperature
from ..metrics import METRIC_NAMES, compute_metrics
from ..report import budget as training_budget
from ..report import stats, tables, verdicts
from ..report.claims import n_seeds, record_claim
from ..report.stats import BOOTSTRAP_METRICS
from ..report.tables import wins
from ..report.writer import save_table
from ..utils.io import atomic_write_json, read_json

MAIN_TABLE_RULE = (
    "Per base model: direction if the Plugin has the best mean over seeds on at least 4 of the 7 metrics; "
    "significant if, against the best other method by mean on each metric, a paired bootstrap over test inputs "
    f"(one per seed; p = share of resamples where the Plugin is not better) gives p < {verdicts.ALPHA} in most "
    f"seeds (more than half) on most of the {len(BOOTSTRAP_METRICS)} bootstrap metrics "
    f"({', '.join(BOOTSTRAP_METRICS)}; ROUGE-L, METEOR and CIDEr need a Java scorer per resample and are not "
    "bootstrapped). Reproduced: direction and significant; direction only: direction without significance; "
    "not reproduced: best on fewer than 4 of 7. With several base models the weakest verdict counts."
)


def units(profile: Profile, notebook: str, *, dataset: str, models: list[str] | None, methods: list[str] | None,
          seeds: list[int] | None) -> list[grid.Unit]:
    """The grid's units of a main-table notebook: ``runner.run_table``'s runs with its parameters."""
    return grid.table_units(dataset, load_profile(profile, seeds=seeds), notebook, model_names=models,
                            method_names=methods)


def summary_with_input_ci(records: list[dict], profile: Profile) -> pd.DataFrame:
    """Mean and std over seeds of the seven metrics (``tables.summarize``), joined with the 95%
    confidence interval over test inputs of ``stats.CI_METRICS`` (``stats.input_ci_table``,
    ``profile.bootstrap_resamples`` draws): the spread over seeds and the uncertainty from the
    choice of test inputs, side by side."""
    summary = tables.summarize(tables.runs_frame(records))
    return summary.join(stats.input_ci_table(records, profile.bootstrap_resamples))


def table_caption(records: list[dict], dataset: str, profile: Profile) -> str:
    """The main table's caption: scale, seeds, and how the intervals were made."""
    return (tables.caption(records, f"{dataset}: mean and standard deviation of the metrics over seeds.") + " "
            + stats.input_ci_caption(records, profile.bootstrap_resamples))


def paper_comparison(summary: pd.DataFrame, dataset: str, paper_model: str = "LLaMA-3.1-8B") -> pd.DataFrame:
    """Our means next to the paper's for the same methods: cells "ours / paper", and the model
    column says which model is which. Methods the paper does not report (TempNet-greedy) are
    left out: the paper's TempNet row is the sampled TempNet."""
    paper = published.main_results(dataset)
    paper = paper[paper.model == paper_model].set_index("method")
    rows = []
    for (model, method), row in summary.iterrows():
        if method not in paper.index:
            continue
        cells = {"model (ours / paper)": f"{model} / {paper_model}", "method": method}
        for metric in METRIC_NAMES:
            theirs = paper[metric].get(method, np.nan)
            cells[metric] = f"{row[metric]:.4f} / {theirs:.4f}"
        rows.append(cells)
    return pd.DataFrame(rows)


def record_claims(profile: Profile | str, summary: pd.DataFrame, dataset: str, significance: pd.DataFrame,
                  method: str = "Plugin", budget: pd.DataFrame | None = None) -> dict:
    """Check "Plugin outperforms the baselines on nearly all metrics" on our runs (``MAIN_TABLE_RULE``)
    and record it. ``significance``: ``report.stats.significance`` of the same runs; ``budget``:
    ``report.budget.audit`` of them, whose flags go into the statistic (they do not change the
    verdict: they say where a baseline may have been held back by the shared budget)."""
    paper = published.main_results(dataset).set_index(["model", "method"])[list(METRIC_NAMES)]
    paper_wins = wins(paper, method)
    ours = wins(summary, method)
    per_model, verdict_per_model, summaries = {}, [], []
    for _, row in ours.iterrows():
        tests = significance[significance.model == row.model]
        p_per_seed = {r.metric: list(r["p per seed"]) for _, r in tests.iterrows()}
        passing = verdicts.metrics_passing(p_per_seed)
        direction = verdicts.most(row["best on"], len(METRIC_NAMES))
        verdict_per_model.append(verdicts.verdict(direction, verdicts.most(len(passing), len(p_per_seed))))
        per_model[row.model] = {
            "best mean on": int(row["best on"]), "of": len(METRIC_NAMES),
            "bootstrap": {r.metric: {"best baseline": r["best baseline"], "effect": r[method] - r["baseline"],
                                     "p_per_seed": list(r["p per seed"])} for _, r in tests.iterrows()},
            "metrics significant in most seeds": passing,
        }
        bleu = tests[tests.metric == "BLEU"]
        effect = (f"BLEU {bleu[method].iloc[0] - bleu['baseline'].iloc[0]:+.4f} vs {bleu['best baseline'].iloc[0]} "
                  f"(p {'/'.join(f'{p:.3f}' for p in bleu['p per seed'].iloc[0])}); ") if len(bleu) else ""
        summaries.append(f"best mean on {row['best on']}/7; {effect}p < {verdicts.ALPHA} in most seeds on "
                         f"{len(passing)}/{len(p_per_seed)} bootstrap metrics")
    first = significance.iloc[0] if len(significance) else None
    n = {"inputs": int(first["n inputs"]) if first is not None else None,
         "seeds": len(first["seeds"]) if first is not None else None}
    statistic = {"summary": "; ".join(summaries) + f"; {n['inputs']} inputs, {n_seeds(n['seeds'])}",
                 "n": n, "models": per_model}
    if budget is not None:
        statistic["training budget"] = training_budget.summary(budget)
    return record_claim(
        profile,
        f"main_{dataset}",
        f"{dataset}: Plugin has the best mean on most of the seven metrics, significantly against the best baseline",
        "; ".join(f"{r.model}: {r['best on']}/7" for _, r in paper_wins.iterrows()),
        "; ".join(f"{r.model}: {r['best on']}/7 ({r.metrics or 'none'})" for _, r in ours.iterrows()),
        verdicts.weakest(verdict_per_model),
        rule=MAIN_TABLE_RULE,
        statistic=statistic,
    )


# ---------------------------------------------------------------- a control for TempNet's scores


def sampled_base_runs(profile: Profile, task: tasks.Task) -> list[dict]:
    """Exploratory, not a preregistered claim. The base alone sampled exactly as TempNet samples
    (its generation config, each seed's generator; temperature 1 in TempNet's place), per seed:
    what sampling itself costs the base. A TempNet below greedy Zeroshot is read against it.
    Stored under ``diagnostics/sampled_base/`` and reused while its test inputs are the task's."""
    ids = [ex.id for ex in task.test]
    folder = results_dir(profile) / "diagnostics" / "sampled_base" / task.dataset / task.base.name
    found = []
    for seed in profile.seeds:
        path = folder / f"seed{seed}.json"
        record = read_json(path) if path.exists() else None
        if record is None or record["test_ids"] != ids:
            predictions = methods.predict(task, "TempNet", FixedTemperature(), seed, profile.decoding)
            record = {"dataset": task.dataset, "model": task.base.name, "method": "base sampled as TempNet", "seed": seed,
                      "metrics": compute_metrics(predictions, [list(ex.references) for ex in task.test]),
                      "predictions": predictions, "test_ids": ids}
            atomic_write_json(path, record)
        found.append(record)
    return found


def sampled_base_table(profile: Profile, dataset: str, model_name: str | None = None) -> pd.DataFrame:
    """Mean over seeds of the seven metrics: greedy Zeroshot, the base sampled as TempNet samples,
    and TempNet (the stored runs), on the same test inputs; saved as ``sampled_base_<dataset>``
    (a stem ``commands.document.CONTROLS`` lists)."""
    model_name = model_name or profile.base_models[0]
    control = sampled_base_runs(profile, runner.load_task(model_name, dataset, profile))
    stored = [r for r in run_store.load_runs(profile, dataset)
              if r["model"] == model_name and r["method"] in ("Zeroshot", "TempNet")]
    rows = []
    for label, runs in (("Zeroshot (greedy)", [r for r in stored if r["method"] == "Zeroshot"]),
                        ("base sampled as TempNet", control),
                        ("TempNet", [r for r in stored if r["method"] == "TempNet"])):
        if runs and any(r["test_ids"] != control[0]["test_ids"] for r in runs):
            raise ValueError(f"{dataset}: stored {label} runs are on other test inputs than the control; "
                             "run the notebook's table first.")
        if runs:
            rows.append({"method": label, "seeds": len(runs),
                         **{m: float(np.mean([r["metrics"][m] for r in runs])) for m in METRIC_NAMES}})
    table = pd.DataFrame(rows)
    save_table(table, f"sampled_base_{dataset}", profile,
               caption=f"{dataset}: the base alone sampled as TempNet samples (exploratory control), "
                       f"mean over seeds, {len(control[0]['test_ids'])} test inputs")
    return table


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The lowercased alphanumeric word n-grams of a text ("Bill_Oddie" is two words)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def copies_demonstrations(output: str, example, demonstrations, n: int = 3) -> bool:
    """Whether ``output`` has a word n-gram of one of its demonstrations (source or reference)
    that is in neither its own input's source nor its references: text it can only have from
    the demonstrations or by chance (Zeroshot's outputs, scored against the same demonstrations,
    measure the chance)."""
    theirs = set().union(*(word_ngrams(shown.source, n) | word_ngrams(reference, n)
                           for shown, reference in demonstrations))
    own = word_ngrams(example.source, n).union(*(word_ngrams(r, n) for r in example.references))
    return bool((word_ngrams(output, n) & theirs) - own)


def echoes_layout(output: str) -> bool:
    """Whether an output keeps the facts' layout rather than a sentence: a "|" (WebNLG's
    separator) or more than one line."""
    return "|" in output or "\n" in output.strip()


def icl_copying_table(profile: Profile, dataset: str, model_name: str | None = None,
                      task: tasks.Task | None = None) -> pd.DataFrame:
    """Exploratory, not a preregistered claim: why an ICL baseline scores below Zeroshot. Per
    ICL method (stored runs, mean over seeds), the share of outputs that copy their
    demonstrations (:func:`copies_demonstrations`) and that echo the facts' layout
    (:func:`echoes_layout`), each beside Zeroshot's share on the same inputs and demonstrations;
    and BLEU on the inputs where neither output does either ("clean"; NaN where none is),
    against Zeroshot's BLEU there: a deficit that stays there is not explained by copying.
    Saved as ``icl_copying_<dataset>`` (a stem ``commands.document.CONTROLS`` lists)."""
    model_name = model_name or profile.base_models[0]
    task = task or runner.load_task(model_name, dataset, profile)
    stored = [r for r in run_store.load_runs(profile, dataset) if r["model"] == model_name]
    ids = [ex.id for ex in task.test]
    zeroshot = next((r for r in stored if r["method"] == "Zeroshot" and r["test_ids"] == ids), None)
    if zeroshot is None:
        raise ValueError(f"{dataset}: no stored Zeroshot run on the task's test inputs; run the notebook's table first.")
    references = [list(ex.references) for ex in task.test]

    def bleu(outputs: list[str], chosen: list[int]) -> float:
        if not chosen:
            return float("nan")
        return compute_metrics([outputs[i] for i in chosen], [references[i] for i in chosen], ["BLEU"])["BLEU"]

    rows = []
    for method, shots in methods.ICL_SHOTS.items():
        runs = [r for r in stored if r["method"] == method]
        if any(r["test_ids"] != ids for r in runs):
            raise ValueError(f"{dataset}: stored {method} runs are on other test inputs; run the notebook's table first.")
        per_seed = []
        for run in runs:
            demonstrations = task.demonstrations(shots, run["seed"])
            flagged = {}
            for who, outputs in ((method, run["predictions"]), ("Zeroshot", zeroshot["predictions"])):
                flagged[who] = {
                    "copies": [copies_demonstrations(out, ex, demos)
                               for out, ex, demos in zip(outputs, task.test, demonstrations)],
                    "echoes": [echoes_layout(out) for out in outputs]}
            clean = [i for i in range(len(ids))
                     if not any(flags[kind][i] for flags in flagged.values() for kind in ("copies", "echoes"))]
            per_seed.append({
                "copies demonstrations": np.mean(flagged[method]["copies"]),
                "Zeroshot copies": np.mean(flagged["Zeroshot"]["copies"]),
                "echoes layout": np.mean(flagged[method]["echoes"]),
                "Zeroshot echoes": np.mean(flagged["Zeroshot"]["echoes"]),
                "BLEU": run["metrics"]["BLEU"], "Zeroshot BLEU": zeroshot["metrics"]["BLEU"],
                "clean inputs": len(clean),
                "BLEU (clean)": bleu(run["predictions"], clean),
                "Zeroshot BLEU (clean)": bleu(zeroshot["predictions"], clean)})
        if per_seed:
            rows.append({"method": method, "seeds": len(per_seed),
                         **{key: float(np.mean([row[key] for row in per_seed])) for key in per_seed[0]}})
    table = pd.DataFrame(rows)
    one_draw = " (the authors' prompts: one demonstration draw, so the seeds repeat one run)" \
        if task.prompt_style == "authors" else ""
    save_table(table, f"icl_copying_{dataset}", profile,
               caption=f"{dataset}: ICL outputs that copy their demonstrations or echo the facts' layout, beside "
                       f"Zeroshot's on the same inputs, and BLEU where neither does (exploratory), {len(ids)} test "
                       f"inputs, mean over seeds{one_draw}")
    return table


def print_control(control: str, profile: Profile | str, datasets: Sequence[str]) -> None:
    """An exploratory control's table per dataset, printed (``plugin-repro report controls``)."""
    profile = load_profile(profile)
    for dataset in datasets:
        table = (sampled_base_table if control == "sampled-base" else icl_copying_table)(profile, dataset)
        print(table.to_string(index=False, float_format="%.4f"))
