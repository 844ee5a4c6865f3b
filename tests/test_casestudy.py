import pandas as pd
import pytest

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
    records = [
        {"method": "Zeroshot", "seed": 0, "predictions": ["a shoe for walking", "nice shoe"]},
        {"method": "Plugin", "seed": 0, "predictions": ["recycled comfort shoe", "comfort"]},
        {"method": "Plugin", "seed": 1, "predictions": ["recycled shoe", "walking"]},
    ]
    coverage = adidas.coverage_table(records, words)
    assert coverage.loc["Zeroshot", "token_share"] == 0.0
    assert coverage.loc["Plugin", "token_share"] == pytest.approx((3 / 4 + 1 / 3) / 2)
    preference = pd.DataFrame({"seed": [0, 1], "judge": ["embedding"] * 2, "share_a": [0.8, 0.6],
                               "ci_low": [0.7, 0.45]})
    coverage_claim, preference_claim = adidas.record_claims("local", coverage, preference)
    assert coverage_claim["verdict"] == "reproduced"
    assert preference_claim["verdict"] == "not reproduced"  # the CI clears 50% in only 1 of 2 seeds
