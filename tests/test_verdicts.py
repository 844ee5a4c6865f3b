"""report.verdicts: the vocabulary, "most", the tests on counts, intervals and exact rank
correlation, with the knife edges (4/7, p = 0.05, 2 of 4 seeds, rho = 4/5, ties); and the
per-seed bootstrap of report.stats that the rules use."""
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as scipy_stats

from plugin_lib.report import claims, stats, verdicts


def test_the_vocabulary_is_four_verdicts_shared_by_the_claim_records():
    assert verdicts.VERDICTS == ("reproduced", "direction only", "not reproduced", "not measurable at this scale")
    assert claims.VERDICTS == verdicts.VERDICTS


@pytest.mark.parametrize("count, total, expected", [
    (4, 7, True), (3, 7, False),  # exactly 4/7 is most, 3/7 is not
    (2, 3, True), (1, 3, False),
    (2, 4, False), (3, 4, True),  # 2 of 4 is not most
    (1, 1, True), (0, 0, False),
])
def test_most_is_more_than_half(count, total, expected):
    assert verdicts.most(count, total) is expected


def test_p_exactly_alpha_is_not_significant():
    assert not verdicts.significant(0.05)
    assert not verdicts.significant(1 / 20)  # a bootstrap p of 1/(19 + 1) is the float 0.05
    assert verdicts.significant(np.nextafter(0.05, 0))
    assert not verdicts.significant(float("nan"))


def test_passes_in_most_seeds():
    assert verdicts.passes_in_most_seeds([0.01, 0.04, 0.3])
    assert not verdicts.passes_in_most_seeds([0.01, 0.01, 0.2, 0.3])  # 2 of 4 seeds: not most
    assert not verdicts.passes_in_most_seeds([0.05, 0.05, 0.01])  # p = 0.05 fails
    assert verdicts.passes_in_most_seeds([0.01])  # one seed: 1 of 1
    assert not verdicts.passes_in_most_seeds([])


def test_metrics_passing_and_most_metrics():
    p = {"BLEU": [0.01, 0.01, 0.5], "ROUGE-1": [0.01, 0.02, 0.03], "ROUGE-2": [0.5, 0.5, 0.01], "NIST": [0.2] * 3}
    assert verdicts.metrics_passing(p) == ["BLEU", "ROUGE-1"]
    assert not verdicts.passes_on_most_metrics(p)  # 2 of 4 metrics
    p["NIST"] = [0.01, 0.2, 0.03]
    assert verdicts.passes_on_most_metrics(p)


def test_ahead_on_most():
    assert verdicts.ahead_on_most(dict(zip("abcdefg", [1, 1, 1, 1, 0, -1, -1])))  # 4/7
    assert not verdicts.ahead_on_most(dict(zip("abcdefg", [1, 1, 1, 0, 0, -1, -1])))  # 3/7; 0 is not ahead


def test_verdict_and_its_combinations():
    assert verdicts.verdict(True, True) == "reproduced"
    assert verdicts.verdict(True, False) == "direction only"
    assert verdicts.verdict(False, True) == "not reproduced"  # significance without direction is not a claim
    assert verdicts.weakest(["reproduced", "direction only", "not measurable at this scale"]) == "direction only"
    assert verdicts.weakest(["not measurable at this scale"]) == "not measurable at this scale"
    assert verdicts.majority_verdict(["reproduced", "reproduced", "not reproduced"]) == "reproduced"
    assert verdicts.majority_verdict(["reproduced", "direction only", "not reproduced"]) == "direction only"
    assert verdicts.majority_verdict(["reproduced", "not reproduced"]) == "not reproduced"  # 1 of 2 is not most


# ---------------------------------------------------------------- tests on counts


def test_exact_mcnemar_counts_discordant_pairs():
    a = [True] * 6 + [False] * 4 + [True] * 5
    b = [False] * 6 + [False] * 4 + [True] * 5
    result = verdicts.mcnemar_exact(a, b)
    assert (result["a_only"], result["b_only"], result["a"], result["b"]) == (6, 0, 11, 5)
    assert result["p"] == pytest.approx(2 / 2 ** 6)  # 0.03125: significant
    assert verdicts.mcnemar_exact([True] * 5 + [False], [False] * 6)["p"] == pytest.approx(2 / 2 ** 5)  # 0.0625
    assert verdicts.mcnemar_exact(a, a)["p"] == 1.0  # no discordant pair
    assert verdicts.mcnemar_exact([True, False], [False, True])["p"] == 1.0
    with pytest.raises(ValueError, match="paired"):
        verdicts.mcnemar_exact([True], [True, False])


def test_two_proportion_exact():
    assert verdicts.two_proportion_exact(5, 10, 5, 10) == 1.0
    assert verdicts.two_proportion_exact(0, 20, 12, 20) < 0.001
    assert verdicts.two_proportion_exact(1, 3, 7, 98) == pytest.approx(scipy_stats.fisher_exact([[1, 2], [7, 91]]).pvalue)
    assert verdicts.two_proportion_exact(0, 0, 3, 4) == 1.0


def test_paired_bootstrap_ratio_compares_integers():
    hits_a, words_a = [2] * 10, [4] * 10
    assert verdicts.paired_bootstrap_ratio(hits_a, words_a, [1] * 10, [4] * 10, 99) == 1 / 100
    # Equal ratios from different counts (1/2 vs 2/4 in every resample): never better, p = 1.
    assert verdicts.paired_bootstrap_ratio([1] * 10, [2] * 10, [2] * 10, [4] * 10, 99) == 1.0
    # No content words at all reads as a share of 0.
    assert verdicts.paired_bootstrap_ratio([0] * 5, [0] * 5, [1] * 5, [3] * 5, 19) == 1.0
    assert verdicts.paired_bootstrap_ratio([1] * 5, [3] * 5, [0] * 5, [0] * 5, 19) == 1 / 20
    with pytest.raises(ValueError):
        verdicts.paired_bootstrap_ratio([1], [2], [1, 2], [3, 4])


# ---------------------------------------------------------------- intervals over seeds


def test_t_interval_over_seeds():
    interval = verdicts.t_interval([1.0, 2.0, 3.0])
    half = scipy_stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert interval["mean"] == 2.0 and interval["low"] == pytest.approx(2 - half) and interval["n"] == 3
    one_seed = verdicts.t_interval([0.02])
    assert one_seed["mean"] == 0.02 and math.isnan(one_seed["low"]) and math.isnan(one_seed["high"])


# ---------------------------------------------------------------- rank correlation, exactly


def test_spearman_of_one_neighbour_swap_among_four_is_exactly_four_fifths():
    rho = verdicts.spearman_exact([0.3201, 0.4153, 0.4057, 0.4592], [0.4007, 0.4078, 0.4175, 0.4293])
    assert rho == Fraction(4, 5) and isinstance(rho, Fraction)
    # Floating point lands just below 0.8, the knife edge that flipped a verdict once.
    assert scipy_stats.spearmanr([0.3201, 0.4153, 0.4057, 0.4592], [0.4007, 0.4078, 0.4175, 0.4293]).statistic < 0.8
    assert verdicts.format_fraction(rho) == "4/5 (0.800)"


def test_spearman_exact_extremes_and_ties():
    assert verdicts.spearman_exact([1, 2, 3, 4], [10, 20, 30, 40]) == 1
    assert verdicts.spearman_exact([1, 2, 3, 4], [4, 3, 2, 1]) == -1
    assert verdicts.spearman_exact([1, 2, 3, 4], [1, 3, 2, 4]) == Fraction(4, 5)
    assert verdicts.spearman_exact([1, 2, 3, 4], [2, 1, 4, 3]) == Fraction(3, 5)
    assert verdicts.spearman_exact([1, 1, 2, 2], [5, 5, 7, 7]) == 1  # ties on both sides, a rational root
    tied = verdicts.spearman_exact([1, 2, 2, 3], [1, 2, 3, 4])  # average ranks 2.5: an irrational root
    assert tied == pytest.approx(scipy_stats.spearmanr([1, 2, 2, 3], [1, 2, 3, 4]).statistic)
    assert verdicts.average_ranks([3.0, 1.0, 3.0]) == [Fraction(5, 2), 1, Fraction(5, 2)]
    assert math.isnan(verdicts.spearman_exact([1, 1, 1], [1, 2, 3]))
    assert math.isnan(verdicts.spearman_exact([1], [2]))


# ---------------------------------------------------------------- the per-seed bootstrap


def test_bootstrap_p_of_exactly_alpha_is_not_significant(fake_run):
    # 19 resamples in which the perfect system always wins: p = (0 + 1) / (19 + 1) = 0.05 exactly.
    good, bad = fake_run("Plugin", good=12), fake_run("Zeroshot", good=0)
    refs = stats._references("e2e", tuple(good["test_ids"]))
    p = stats.paired_bootstrap(good["predictions"], bad["predictions"], refs, n_resamples=19, seed=0)
    assert set(p.values()) == {0.05}
    assert not any(verdicts.significant(v) for v in p.values())
    p = stats.paired_bootstrap(good["predictions"], bad["predictions"], refs, n_resamples=20, seed=0)
    assert all(verdicts.significant(v) for v in p.values())  # 1/21


def test_compare_runs_pairs_seeds_and_the_single_zeroshot_run(fake_run):
    plugin = [fake_run("Plugin", seed, good=12, score=0.5 + 0.01 * seed) for seed in (2, 0, 1)]
    zeroshot = [fake_run("Zeroshot", 0, good=0, score=0.2)]
    comparison = stats.compare_runs(plugin, zeroshot, n_resamples=30)
    assert comparison["seeds"] == [0, 1, 2] and comparison["n_inputs"] == 12
    assert comparison["effect"]["BLEU"] == pytest.approx(0.31) and len(comparison["effect"]) == 7
    assert comparison["p_per_seed"]["BLEU"] == [1 / 31] * 3
    assert comparison["metrics_significant"] == list(stats.BOOTSTRAP_METRICS)
    tie = stats.compare_runs(plugin, plugin, n_resamples=30)
    assert all(ps == [1.0] * 3 for ps in tie["p_per_seed"].values()) and tie["metrics_significant"] == []


def test_compare_runs_pairs_only_common_seeds_and_the_same_inputs(fake_run):
    plugin = [fake_run("Plugin", 0, score=0.5), fake_run("Plugin", 1, score=0.7)]
    # Only the seeds both systems have are compared (and averaged for the effect).
    partial = stats.compare_runs(plugin, [fake_run("BDPL", 0, score=0.1), fake_run("BDPL", 2, score=0.3)], 5)
    assert partial["seeds"] == [0] and partial["effect"]["BLEU"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="No seed in common"):
        stats.compare_runs(plugin, [fake_run("BDPL", 2), fake_run("BDPL", 3)], n_resamples=5)
    shuffled = fake_run("BDPL", 0)
    shuffled["test_ids"] = shuffled["test_ids"][::-1]
    with pytest.raises(ValueError, match="same test inputs"):
        stats.compare_runs(plugin[:1], [shuffled], n_resamples=5)


def test_significance_keeps_every_seeds_p_value(fake_run):
    records = [fake_run("Plugin", seed, good=12 - seed) for seed in (0, 1, 2)]
    records += [fake_run("Zeroshot", 0, good=0), fake_run("ICL-1", 0, good=6), fake_run("ICL-1", 1, good=6),
                fake_run("ICL-1", 2, good=6)]
    table = stats.significance(records, n_resamples=20, metrics=("BLEU", "ROUGE-1"))
    assert list(table.metric) == ["BLEU", "ROUGE-1"] and set(table["best baseline"]) == {"ICL-1"}
    for _, row in table.iterrows():
        assert row["seeds"] == (0, 1, 2) and row["n inputs"] == 12 and len(row["p per seed"]) == 3
        assert row["p (max over seeds)"] == max(row["p per seed"])


def test_exact_ranks_and_rho_agree_with_scipy():
    """The ranks come from scipy (issue 59); the exact rho equals scipy's float rho, ties or not."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        x, y = rng.integers(0, 5, 7).tolist(), rng.integers(0, 5, 7).tolist()
        if len(set(x)) < 2 or len(set(y)) < 2:
            continue
        assert verdicts.average_ranks(x) == [Fraction(float(r)) for r in scipy_stats.rankdata(x)]
        assert float(verdicts.spearman_exact(x, y)) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)
    assert verdicts.average_ranks([3, 1, 3, 2]) == [Fraction(7, 2), 1, Fraction(7, 2), 2]
