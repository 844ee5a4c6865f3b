"""report.budget: runs still improving at the epoch cap and choices at a grid edge are flagged."""
import pandas as pd
import pytest

from plugin_lib.harness.profile import load_profile
from plugin_lib.report import budget


def run(method, seed, best_epoch, epochs_run, **hparams):
    training = {"best_epoch": best_epoch, "epochs_run": epochs_run} if method != "Zeroshot" else None
    return {"dataset": "e2e", "model": "m", "method": method, "seed": seed, "training": training,
            "hparams": hparams or None}


def test_still_improving_needs_the_best_epoch_to_be_the_cap():
    assert budget.still_improving({"best_epoch": 8, "epochs_run": 8}, 8)
    assert not budget.still_improving({"best_epoch": 7, "epochs_run": 8}, 8)  # stopped improving
    assert not budget.still_improving({"best_epoch": 3, "epochs_run": 3}, 8)  # data ran out, not the cap
    assert not budget.still_improving(None, 8)


def test_audit_flags_the_cap_and_the_edges_per_method(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    profile = load_profile("local")  # lr grid [1e-3, 5e-3], alpha [0.25, 0.5, 0.75], cap 8
    records = [
        run("Zeroshot", 0, 0, 0),
        run("WeightedComb", 0, 8, 8, lr=1e-3, weight_decay=0.01, alpha=0.25),
        run("WeightedComb", 1, 6, 8, lr=1e-3, weight_decay=0.01, alpha=0.25),
        run("Plugin", 0, 3, 5, lr=1e-3, weight_decay=0.01),
    ]
    frame = budget.audit(records, profile).set_index("method")
    assert "Zeroshot" not in frame.index
    assert frame.loc["WeightedComb", "still improving at cap"] == 1
    assert frame.loc["WeightedComb", "seeds"] == 2
    assert frame.loc["WeightedComb", "at grid edge"] == "lr, alpha"
    assert frame.loc["Plugin", "still improving at cap"] == 0
    flags = budget.flags(frame.reset_index())
    assert flags[("m", "WeightedComb")][0] == f"{budget.STILL_IMPROVING} in 1/2 seeds"
    assert "lr" in flags[("m", "Plugin")][0]
    assert "WeightedComb (m)" in budget.summary(frame.reset_index())


def test_the_late_gain_tells_a_plateau_from_a_descent():
    def history(*losses):
        return {"history": [{"epoch": e, "val_loss": v} for e, v in enumerate(losses, start=1)]}

    plateau = history(1.0, 0.5, 0.40, 0.41, 0.399, 0.4, 0.398)  # gain 0.602, of which 0.002 late
    assert budget.late_gain(plateau, 3) == pytest.approx(0.002 / 0.602)
    descent = history(1.0, 0.9, 0.8, 0.7, 0.6)
    assert budget.late_gain(descent, 2) == pytest.approx(0.2 / 0.4)
    assert budget.late_gain(history(1.0, 1.1, 1.2), 1) == 0.0  # never improved
    assert budget.late_gain({"best_epoch": 3, "epochs_run": 3}, 2) is None  # a record without a history


def test_a_flagged_run_says_how_much_it_gained_late(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    profile = load_profile("local")  # cap 8, patience 2
    flat = run("TempNet", 0, 8, 8, lr=1e-3, weight_decay=0.01)
    flat["training"]["history"] = [{"val_loss": v} for v in (2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.99, 0.98)]
    frame = budget.audit([flat], profile)
    assert frame.loc[0, "late gain"] == pytest.approx(0.02 / 1.02)
    assert budget.flags(frame)[("m", "TempNet")][0] == (f"{budget.STILL_IMPROVING} in 1/1 seed, at most 2.0% of "
                                                       "its gain in its last 2 epochs")


def test_an_unknown_late_gain_is_not_reported_as_a_plateau(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    nan = {"history": [{"val_loss": float("nan")}, {"val_loss": 1.0}, {"val_loss": 0.9}]}
    assert budget.late_gain(nan, 1) is None
    profile = load_profile("local")  # cap 8
    with_history = run("TempNet", 0, 8, 8, lr=1e-3, weight_decay=0.01)
    with_history["training"]["history"] = [{"val_loss": v} for v in (2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.99)]
    without = run("TempNet", 1, 8, 8, lr=1e-3, weight_decay=0.01)  # a record made before histories
    frame = budget.audit([with_history, without], profile)
    assert frame.loc[0, "still improving at cap"] == 2 and pd.isna(frame.loc[0, "late gain"])
    assert budget.flags(frame)[("m", "TempNet")][0] == f"{budget.STILL_IMPROVING} in 2/2 seeds"


def test_the_audit_prints_per_dataset(tmp_path, monkeypatch, capsys):
    from plugin_lib.utils.io import atomic_write_json

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    budget.print_audit("local", ["webnlg"])
    assert capsys.readouterr().out == "webnlg: no trained run stored\n"
    atomic_write_json(tmp_path / "local" / "runs" / "e2e" / "m" / "Plugin-seed0.json",
                      run("Plugin", 0, 8, 8, lr=1e-3, weight_decay=0.01))
    budget.print_audit("local", ["e2e"])
    out = capsys.readouterr().out
    assert out.startswith(f"e2e: Plugin (m): {budget.STILL_IMPROVING} in 1/1 seed, {budget.AT_EDGE} (lr)\n")
    assert "lr=0.001, weight_decay=0.01" in out  # then the table
