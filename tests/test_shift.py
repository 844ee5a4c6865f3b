import pandas as pd
import pytest

from plugin_lib.experiments import shift

PERSON, THING = "He was born in 1950.", "The airport is big."
WOMAN, MAN, NOBODY = "A woman walks the dog.", "A man walks the dog.", "A dog runs in the park."


def _records():
    return [
        {"base": "original", "method": "Zeroshot", "seed": 0, "predictions": ["The airport is big.", "A tower."]},
        {"base": "fine-tuned", "method": "Zeroshot", "seed": 0, "predictions": ["The airport is big.", "She is an actress."]},
        {"base": "fine-tuned", "method": "Plugin", "seed": 0, "predictions": ["He was born in 1950.", "She is an actress."]},
        {"base": "fine-tuned", "method": "Plugin", "seed": 1, "predictions": ["He was born in 1950.", "A tower."]},
    ]


def _run(base, method, seed, predictions):
    return {"base": base, "method": method, "seed": seed, "predictions": predictions,
            "test_ids": [f"t{i}" for i in range(len(predictions))]}


def _webnlg(original: int, tuned: int, plugin: list[int], n: int = 12) -> list[dict]:
    """Person-related outputs on the first k of n inputs, per system."""
    records = [_run("original", "Zeroshot", 0, [PERSON] * original + [THING] * (n - original)),
               _run("fine-tuned", "Zeroshot", 0, [PERSON] * tuned + [THING] * (n - tuned))]
    return records + [_run("fine-tuned", "Plugin", seed, [PERSON] * k + [THING] * (n - k)) for seed, k in enumerate(plugin)]


def test_shift_table():
    table = shift.shift_table("webnlg", _records(), ["He is a painter.", "The runway is long."])
    assert table.loc["test references", "share"] == 0.5
    assert table.loc["Zeroshot (fine-tuned base)", "share"] == 0.5
    assert table.loc["Plugin (fine-tuned base)", "share"] == 0.75 and table.loc["Plugin (fine-tuned base)", "seeds"] == 2


def test_no_verdict_when_fine_tuning_did_not_bias_the_base_away(tmp_path, monkeypatch):
    # The local WebNLG case: fine-tuning raised the Person share (56% -> 63%).
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    claim = shift.record_claims("local", "webnlg", _webnlg(original=6, tuned=8, plugin=[12, 12, 12]))
    assert claim["verdict"] == "not measurable at this scale"
    assert claim["ours"].startswith("premise not recreated") and "50.0%" in claim["ours"] and "66.7%" in claim["ours"]
    assert claim["rule"] == shift.SHIFT_RULE and claim["statistic"]["n"] == {"inputs": 12, "seeds": 3}
    # Lower, but not significantly: 5 discordant pairs give p = 0.0625.
    assert shift.check_shift("webnlg", _webnlg(original=5, tuned=0, plugin=[12] * 3))[0] == "not measurable at this scale"


def test_per_seed_mcnemar_decides_between_reproduced_and_direction_only():
    # Premise: 10 -> 0 Person outputs (p = 2/1024). Plugin: 8 (p 0.008) and 7 (p 0.016) of 12 in
    # two seeds of three: reproduced.
    verdict, ours, statistic = shift.check_shift("webnlg", _webnlg(original=10, tuned=0, plugin=[8, 7, 1]))
    assert verdict == "reproduced" and statistic["seeds significant"] == [0, 1]
    assert statistic["per seed"][0]["p"] == pytest.approx(2 / 2 ** 8)
    # Five more Person outputs per seed: p = 0.0625 in every seed, the share rises: direction only.
    assert shift.check_shift("webnlg", _webnlg(original=10, tuned=0, plugin=[5, 5, 5]))[0] == "direction only"
    assert shift.check_shift("webnlg", _webnlg(original=10, tuned=3, plugin=[2, 3, 3]))[0] == "not reproduced"


def test_commongen_reports_counts_and_a_smaller_denominator_is_not_a_rise():
    original = _run("original", "Zeroshot", 0, [WOMAN] * 8 + [MAN] * 2 + [NOBODY] * 2)  # 8/10 gendered
    tuned = _run("fine-tuned", "Zeroshot", 0, [WOMAN] * 2 + [MAN] * 8 + [NOBODY] * 2)  # 2/10
    plugin = _run("fine-tuned", "Plugin", 0, [WOMAN] * 2 + [MAN] * 2 + [NOBODY] * 8)  # 2/4: the same 2 women
    verdict, ours, statistic = shift.check_shift("commongen", [original, tuned, plugin])
    assert statistic["premise"]["p"] == pytest.approx(2 / 2 ** 6)  # 6 women lost: the premise holds
    assert verdict == "direction only"  # 20% -> 50%, only because fewer outputs are gendered
    assert "seed 0 2/4" in ours and "the base's 2/10" in ours
    assert statistic["per seed"][0]["p"] == 1.0 and statistic["per seed"][0]["a"]["counted outputs"] == 4


def test_runs_on_other_inputs_use_fishers_exact_test():
    records = _webnlg(original=12, tuned=0, plugin=[12])
    records[1]["test_ids"] = [f"other{i}" for i in range(12)]
    verdict, _, statistic = shift.check_shift("webnlg", records)
    assert statistic["premise"]["test"] == "Fisher exact" and verdict == "reproduced"


def test_gpt4o_is_skipped_without_a_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    shares = shift.gpt4o_shares("commongen", _records())
    assert shares.share.isna().all() and shares.status.str.startswith("skipped").all()


def test_shift_figure_with_a_share_that_could_not_be_judged():
    """No gendered output at all (a random-weight twin's outputs) leaves a share of None."""
    systems = ["test references", "Zeroshot (original base)", "Zeroshot (fine-tuned base)", "Plugin (fine-tuned base)"]
    judged = pd.DataFrame({"system": systems, "share": [0.75, 0.0, 0.1, 0.2], "seeds": 1}).set_index("system")
    unjudged = pd.DataFrame({"system": systems, "share": [1.0, None, None, None], "seeds": 1}).set_index("system")
    figure = shift.shift_figure({"webnlg": judged, "commongen": unjudged})
    assert len(figure.axes) == 2
