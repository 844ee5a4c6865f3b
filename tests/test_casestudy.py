import pandas as pd
import pytest

from plugin_lib import analysis
from plugin_lib.experiments import adidas


def test_telling_steps_pick_the_largest_shifts():
    trace = pd.DataFrame({
        "step": [1, 1, 2, 2, 3, 3],
        "word": ["a", "b"] * 3,
        "base": [0.1, 0.1, 0.5, 0.0, 0.2, 0.2],
        "plugin": [0.1, 0.1, 0.0, 0.5, 0.3, 0.2],
    })
    assert adidas.telling_steps(trace, 2) == [2, 3]


def test_coverage_table_and_claims(tmp_path, monkeypatch, nltk_ready):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    words = pd.DataFrame({"word": ["recycled", "comfort"], "count": [5, 3]})
    ids = ["a", "b"]
    records = [
        {"method": "Zeroshot", "seed": 0, "test_ids": ids, "predictions": ["a shoe for walking", "nice shoe"]},
        {"method": "Plugin", "seed": 0, "test_ids": ids, "predictions": ["recycled comfort shoe", "comfort"]},
        {"method": "Plugin", "seed": 1, "test_ids": ids, "predictions": ["recycled shoe", "walking"]},
    ]
    coverage = adidas.coverage_table(records, words)
    assert coverage.loc["Zeroshot", "token_share"] == 0.0
    assert coverage.loc["Plugin", "token_share"] == pytest.approx((3 / 4 + 1 / 3) / 2)
    assert analysis.coverage_counts(records[1]["predictions"], words) == ([2, 1], [3, 1])
    preference = pd.DataFrame({"seed": [0, 1, 0, 1], "judge": ["embedding"] * 2 + ["rouge_l"] * 2,
                               "share_a": [0.8, 0.6, 0.9, 0.9], "wins_a": [80, 60, 90, 90], "wins_b": [20, 40, 10, 10],
                               "ties": [0] * 4, "n_items": [100] * 4, "p_value": [1e-9, 0.057, 1e-12, 1e-12]})
    coverage_claim, preference_claim = adidas.record_claims("local", coverage, preference, records, words, 20)
    # Seed 0 wins every resample (p = 1/21); a resample of seed 1 holding only "walking" ties
    # with the base (about 1 in 4): significant in 1 of 2 seeds, which is not most.
    assert coverage_claim["rule"] == adidas.COVERAGE_RULE and len(coverage_claim["statistic"]["per seed"]) == 2
    assert coverage_claim["statistic"]["per seed"]["0"]["p"] == 1 / 21
    assert coverage_claim["statistic"]["per seed"]["1"]["p"] > 0.05
    assert coverage_claim["verdict"] == "direction only"
    # Preference: the embedding judge decides; p < 0.05 in 1 of 2 seeds is not most.
    assert preference_claim["verdict"] == "direction only" and "proxy judge, not human raters" in preference_claim["rule"].lower()
    assert preference_claim["statistic"]["per seed"]["embedding seed 1"]["p"] == 0.057


def test_coverage_bootstrap_per_seed(nltk_ready):
    words = pd.DataFrame({"word": ["recycled", "comfort"], "count": [5, 3]})
    ids = [str(i) for i in range(12)]
    base = {"method": "Zeroshot", "seed": 0, "test_ids": ids, "predictions": ["a plain shoe"] * 12}
    plugin = [{"method": "Plugin", "seed": s, "test_ids": ids, "predictions": ["a recycled comfort shoe"] * 12}
              for s in (0, 1, 2)]
    verdict, ours, statistic = adidas.check_coverage([base, *plugin], words, n_resamples=20)
    assert verdict == "reproduced" and statistic["per seed"][0]["p"] == 1 / 21
    assert statistic["per seed"][0]["Plugin"] == "24/36" and statistic["per seed"][0]["Zeroshot"] == "0/24"
    verdict, _, _ = adidas.check_coverage([base, *plugin], words, n_resamples=19)
    assert verdict == "direction only"  # p = 1/20 = 0.05 exactly in every seed: not significant
    worse = [dict(p, predictions=["a plain shoe"] * 12) for p in plugin]
    assert adidas.check_coverage([base, *worse], words, n_resamples=20)[0] == "not reproduced"


def test_preference_needs_most_seeds_significant_in_the_plugins_favour():
    frame = pd.DataFrame({"seed": [0, 1, 2], "judge": ["embedding"] * 3, "share_a": [0.64, 0.58, 0.64],
                          "wins_a": [62, 56, 62], "wins_b": [35, 41, 35], "ties": [0] * 3, "n_items": [97] * 3,
                          "p_value": [0.008, 0.155, 0.008]})
    assert adidas.check_preference(frame)[0] == "reproduced"  # the local run: 2 of 3 seeds
    losing = frame.assign(share_a=1 - frame.share_a, wins_a=frame.wins_b, wins_b=frame.wins_a)
    assert adidas.check_preference(losing)[0] == "not reproduced"  # significant, the wrong way
