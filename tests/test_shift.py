import pandas as pd

from plugin_lib.experiments import shift


def _records():
    return [
        {"base": "original", "method": "Zeroshot", "seed": 0, "predictions": ["The airport is big.", "A tower."]},
        {"base": "fine-tuned", "method": "Zeroshot", "seed": 0, "predictions": ["The airport is big.", "She is an actress."]},
        {"base": "fine-tuned", "method": "Plugin", "seed": 0, "predictions": ["He was born in 1950.", "She is an actress."]},
        {"base": "fine-tuned", "method": "Plugin", "seed": 1, "predictions": ["He was born in 1950.", "A tower."]},
    ]


def test_shift_table_and_claim(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    table = shift.shift_table("webnlg", _records(), ["He is a painter.", "The runway is long."])
    assert table.loc["test references", "share"] == 0.5
    assert table.loc["Zeroshot (fine-tuned base)", "share"] == 0.5
    assert table.loc["Plugin (fine-tuned base)", "share"] == 0.75 and table.loc["Plugin (fine-tuned base)", "seeds"] == 2
    claim = shift.record_claims("local", "webnlg", table)
    assert claim["verdict"] == "reproduced" and "50.0% -> 75.0%" in claim["ours"]


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
