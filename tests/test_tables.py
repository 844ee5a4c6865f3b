import numpy as np
import pandas as pd
import pytest

from plugin_lib import paper as published
from plugin_lib.experiments import main_tables
from plugin_lib.report import stats, tables
from plugin_lib.metrics import METRIC_NAMES, compute_metrics
from plugin_lib.metrics.resample import resample_counts


def _records():
    rows = []
    for method, base in [("Zeroshot", 0.1), ("ICL-1", 0.2), ("Plugin", 0.3)]:
        for seed in ([0] if method == "Zeroshot" else [0, 1]):
            metrics = {m: base + 0.01 * seed for m in METRIC_NAMES}
            rows.append({"model": "m", "method": method, "seed": seed, "metrics": metrics})
    return rows


def test_summary_means_stds_and_method_order():
    summary = tables.summarize(tables.runs_frame(_records()))
    assert list(summary.index.get_level_values("method")) == ["Zeroshot", "ICL-1", "Plugin"]
    assert summary.loc[("m", "Plugin"), "BLEU"] == pytest.approx(0.305)
    assert summary.loc[("m", "Plugin"), "BLEU_std"] == pytest.approx(np.std([0.3, 0.31], ddof=1))
    assert np.isnan(summary.loc[("m", "Zeroshot"), "BLEU_std"]) and summary.loc[("m", "Zeroshot"), "seeds"] == 1


def test_best_is_bold_and_second_underlined():
    summary = tables.summarize(tables.runs_frame(_records()))
    md = tables.format_table(summary, "markdown").set_index("method")
    assert md.loc["Plugin", "BLEU"].startswith("**0.3050**")
    assert md.loc["ICL-1", "BLEU"].startswith("<u>0.2050</u>")
    assert md.loc["Zeroshot", "BLEU"] == "0.1000"
    tex = tables.format_table(summary, "latex").set_index("method")
    assert tex.loc["Plugin", "NIST"].startswith(r"\textbf{0.3050}$_{\pm")


def test_results_table_files(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    summary = tables.summarize(tables.runs_frame(_records()))
    paths = tables.save_results_table(summary, "t", "smoke", "A caption.")
    assert pd.read_csv(paths["csv"]).shape[0] == 3
    assert "A caption." in paths["md"].read_text() and r"\textbf" in paths["tex"].read_text()
    assert tables.wins(summary).loc[0, "best on"] == 7


def test_paired_bootstrap_detects_a_clear_winner_and_not_a_tie():
    refs = [[f"the {w} sat on the mat near the door"] for w in ["cat", "dog", "bird", "cow", "fox", "owl"] * 3]
    good = [r[0] for r in refs]
    bad = ["a completely different sentence" for _ in refs]
    p_good = stats.paired_bootstrap(good, bad, refs, n_resamples=50, seed=0)
    p_tie = stats.paired_bootstrap(good, good, refs, n_resamples=50, seed=0)
    assert all(p < 0.05 for p in p_good.values())
    assert all(p == 1.0 for p in p_tie.values())


def test_paired_bootstrap_equals_rescoring_every_drawn_corpus():
    from plugin_lib.metrics import compute_metrics
    from plugin_lib.metrics.resample import resample_counts

    refs = [["the cat sat on the mat", "a cat is on the mat"], ["dogs run in the park"],
            ["the bird sings", "a bird is singing in the tree", "birds sing"], ["cows eat grass in a field"]]
    a = ["the cat is on the mat", "a dog runs in a park", "the bird sings", "cows eat grass"]
    b = ["cat mat", "dogs in the park run", "a bird", "the cow eats the grass in a field"]
    metrics = ("BLEU", "ROUGE-1", "NIST")
    p = stats.paired_bootstrap(a, b, refs, metrics, n_resamples=20, seed=3)
    not_better = dict.fromkeys(metrics, 0)
    for row in resample_counts(len(refs), 20, seed=3):  # the same draws, scored from the texts
        idx = [i for i, k in enumerate(row) for _ in range(k)]
        score_a = compute_metrics([a[i] for i in idx], [refs[i] for i in idx], metrics)
        score_b = compute_metrics([b[i] for i in idx], [refs[i] for i in idx], metrics)
        for m in metrics:
            not_better[m] += score_a[m] <= score_b[m]
    assert p == {m: (not_better[m] + 1) / 21 for m in metrics}


def test_paper_results_are_the_papers_tables():
    paper = published.main_results("e2e")
    row = paper[(paper.model == "GPT2-XL") & (paper.method == "Plugin")].iloc[0]
    assert row["BLEU"] == 0.2470 and row["NIST"] == 1.2736 and row["BLEU_std"] == 0.009
    assert len(published.main_results()) == 4 * 3 * 7


def test_paper_comparison_labels_which_number_is_whose():
    summary = pd.DataFrame({m: [0.5] for m in METRIC_NAMES} | {f"{m}_std": [0.0] for m in METRIC_NAMES},
                           index=pd.MultiIndex.from_tuples([("tiny", "Plugin")], names=["model", "method"]))
    row = main_tables.paper_comparison(summary, "e2e").iloc[0]
    assert row["model (ours / paper)"] == "tiny / LLaMA-3.1-8B"
    assert row["BLEU"] == "0.5000 / 0.3691"  # the paper's Table 1, LLaMA-3.1-8B Plugin


def test_paper_comparison_matches_the_sampled_tempnet_and_leaves_out_greedy_tempnet():
    methods = ["Zeroshot", "TempNet", "TempNet-greedy"]
    summary = pd.DataFrame({m: [0.5] * 3 for m in METRIC_NAMES} | {f"{m}_std": [0.0] * 3 for m in METRIC_NAMES},
                           index=pd.MultiIndex.from_tuples([("tiny", m) for m in methods], names=["model", "method"]))
    comparison = main_tables.paper_comparison(summary, "e2e")
    assert list(comparison.method) == ["Zeroshot", "TempNet"]  # the paper has no greedy TempNet row
    assert comparison.iloc[1]["BLEU"] == "0.5000 / 0.3502"  # the paper's Table 1, LLaMA-3.1-8B TempNet


# ---------------------------------------------------------------- the main tables' verdict


def _main(best_on: int, p_per_seed: dict[str, list[float]], n_inputs: int = 100):
    """A summary where the Plugin has the best mean on ``best_on`` of the seven metrics, and a
    ``stats.significance`` table with the given per-seed p-values against WeightedComb."""
    rows = []
    for method, base in (("Zeroshot", 0.1), ("WeightedComb", 0.3), ("Plugin", 0.3)):
        for seed in (0, 1, 2):
            values = {m: base + (0.05 if method == "Plugin" and i < best_on else -0.05 if method == "Plugin" else 0)
                      for i, m in enumerate(METRIC_NAMES)}
            rows.append({"model": "m", "method": method, "seed": seed, **values})
    summary = tables.summarize(pd.DataFrame(rows))
    significance = pd.DataFrame([
        {"model": "m", "metric": metric, "best baseline": "WeightedComb", "Plugin": 0.35, "baseline": 0.3,
         "p (max over seeds)": max(ps), "p per seed": tuple(ps), "seeds": (0, 1, 2), "n inputs": n_inputs}
        for metric, ps in p_per_seed.items()])
    return summary, significance


SIGNIFICANT = [0.01, 0.02, 0.5]  # 2 of 3 seeds: most
NOT_SIGNIFICANT = [0.43, 0.57, 0.28]  # the CommonGen BLEU against WeightedComb


@pytest.mark.parametrize("best_on, passing, verdict", [
    (4, 3, "reproduced"),  # exactly 4/7 metrics, 3/4 bootstrap metrics
    (7, 2, "direction only"),  # 2 of 4 bootstrap metrics is not most
    (6, 0, "direction only"),
    (3, 4, "not reproduced"),  # 3/7: not the paper's direction, whatever the tests say
])
def test_main_table_rule(tmp_path, monkeypatch, best_on, passing, verdict):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    p = {m: SIGNIFICANT if i < passing else NOT_SIGNIFICANT for i, m in enumerate(stats.BOOTSTRAP_METRICS)}
    summary, significance = _main(best_on, p)
    claim = main_tables.record_claims("local", summary, "e2e", significance)
    assert claim["verdict"] == verdict and claim["rule"] == main_tables.MAIN_TABLE_RULE
    assert claim["statistic"]["n"] == {"inputs": 100, "seeds": 3}
    model = claim["statistic"]["models"]["m"]
    assert model["best mean on"] == best_on and len(model["metrics significant in most seeds"]) == passing
    assert model["bootstrap"]["BLEU"]["p_per_seed"] == (SIGNIFICANT if passing else NOT_SIGNIFICANT)
    assert f"best mean on {best_on}/7" in claim["statistic"]["summary"]


def test_main_table_knife_edges(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    at_alpha = {m: [0.05, 0.05, 0.01] for m in stats.BOOTSTRAP_METRICS}  # p = 0.05 is not significant
    summary, significance = _main(7, at_alpha)
    assert main_tables.record_claims("local", summary, "e2e", significance)["verdict"] == "direction only"
    four_seeds = _main(7, {m: [0.01, 0.01, 0.3, 0.3] for m in stats.BOOTSTRAP_METRICS})  # 2 of 4 seeds
    assert main_tables.record_claims("local", four_seeds[0], "e2e", four_seeds[1])["verdict"] == "direction only"


# ---------------------------------------------------------------- confidence intervals over test inputs

CI_REFS = [[f"the {w} sat on the mat near the door", f"a {w} is on the mat"] for w in ("cat", "dog", "owl")] + \
    [["there is a small red house by the river"], ["the old man walks his dog every morning", "an old man and his dog"]]
CI_SEED_0 = ["the cat sat on a mat", "a dog sat near the door", "the owl is on the mat",
             "a small house by the river", "the old man walks every morning"]
CI_SEED_1 = ["the cat is on the mat near the door", "the dog sat", "an owl sat on the mat near a door",
             "there is a red house", "an old man walks his dog"]


def test_input_ci_is_the_percentile_interval_of_the_seed_mean_over_draws():
    runs = [{"predictions": CI_SEED_0}, {"predictions": CI_SEED_1}]
    metrics = ("BLEU", "NIST")  # no Java needed
    interval = stats.input_ci(runs, CI_REFS, n_resamples=40, metrics=metrics, seed=7)
    # The same computation spelled out: draw inputs, score each seed's drawn corpus with
    # compute_metrics, average the seeds, take the 2.5th and 97.5th percentiles.
    counts = resample_counts(len(CI_REFS), 40, seed=7)
    for metric in metrics:
        means = []
        for row in counts:
            order = np.repeat(np.arange(len(CI_REFS)), row)
            refs = [CI_REFS[i] for i in order]
            means.append(np.mean([compute_metrics([r["predictions"][i] for i in order], refs, (metric,))[metric]
                                  for r in runs]))
        assert interval[metric] == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])), rel=1e-9)
        whole = np.mean([compute_metrics(r["predictions"], CI_REFS, (metric,))[metric] for r in runs])
        assert interval[metric][0] < whole < interval[metric][1]


def test_input_ci_needs_predictions_for_every_input():
    with pytest.raises(ValueError, match="4 predictions for 5 inputs"):
        stats.input_ci([{"predictions": CI_SEED_0[:4]}], CI_REFS, 10, metrics=("BLEU",))


def _ci_records():
    records = []
    for method, seeds in (("Zeroshot", [CI_SEED_0]), ("Plugin", [CI_SEED_0, CI_SEED_1])):
        for seed, predictions in enumerate(seeds):
            records.append({"model": "m", "method": method, "seed": seed, "dataset": "toy",
                            "test_ids": [f"t{i}" for i in range(len(CI_REFS))], "predictions": predictions,
                            "metrics": {m: 0.1 + 0.1 * seed + (method == "Plugin") * 0.2 for m in METRIC_NAMES}})
    return records


def test_input_ci_table_joins_the_summary_and_is_written_beside_each_metric(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(stats, "_references", lambda dataset, ids: CI_REFS)
    records = _ci_records()
    ci = stats.input_ci_table(records, n_resamples=30, metrics=("BLEU", "NIST"))
    assert list(ci.columns) == ["BLEU_ci_low", "BLEU_ci_high", "NIST_ci_low", "NIST_ci_high"]
    plugin = [r for r in records if r["method"] == "Plugin"]
    assert tuple(ci.loc[("m", "Plugin"), ["BLEU_ci_low", "BLEU_ci_high"]]) == pytest.approx(
        stats.input_ci(plugin, CI_REFS, 30, ("BLEU",))["BLEU"])
    summary = tables.summarize(tables.runs_frame(records)).join(ci)
    md = tables.format_table(summary, "markdown")
    assert list(md.columns[2:6]) == ["BLEU", "BLEU 95% CI", "ROUGE-1", "ROUGE-2"] and md.columns[-1] == "NIST 95% CI"
    low, high = ci.loc[("m", "Zeroshot"), ["BLEU_ci_low", "BLEU_ci_high"]]
    assert md.set_index("method").loc["Zeroshot", "BLEU 95% CI"] == f"[{low:.4f}, {high:.4f}]"
    paths = tables.save_results_table(summary, "t", "smoke", "A caption.")
    assert r"BLEU 95\% CI" in paths["tex"].read_text() and "BLEU 95% CI" in paths["md"].read_text()
    assert pd.read_csv(paths["csv"])["NIST_ci_high"].notna().all()
    caption = stats.input_ci_caption(records, 30, ("BLEU", "NIST"))
    assert "over the 5 test inputs (30 draws" in caption and caption.endswith("for BLEU, NIST only.")


def test_input_ci_table_refuses_seeds_on_different_inputs(monkeypatch):
    monkeypatch.setattr(stats, "_references", lambda dataset, ids: CI_REFS)
    records = _ci_records()
    records[-1] = {**records[-1], "test_ids": list(reversed(records[-1]["test_ids"]))}
    with pytest.raises(ValueError, match="Plugin: its runs are not on the same test inputs"):
        stats.input_ci_table(records, n_resamples=5, metrics=("BLEU",))
