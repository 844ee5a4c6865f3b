"""report.budget: runs still improving at the epoch cap and choices at a grid edge are flagged."""
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
