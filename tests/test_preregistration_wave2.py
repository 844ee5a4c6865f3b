"""The second preregistered wave (issue 45): its frozen rules on constructed comparisons, and the
check that git history shows those rules before every wave-2 result."""
import numpy as np
import pytest

from plugin_lib.metrics import METRIC_NAMES
from plugin_lib.report import freeze, preregistered as pre, preregistered_wave2 as wave2

from test_preregistration import PROFILES, history  # noqa: F401 - the fixture


def test_git_history_shows_the_wave2_rules_before_every_wave2_result():
    try:
        problems = freeze.check_wave2()
    except freeze.HistoryUnavailable as why:
        pytest.skip(f"no git history to check: {why}")
    assert problems == []


def test_the_wave2_check_flags_early_results_and_changed_rules(history):  # noqa: F811
    repo, commit = history
    early = commit({"results/confirm/runs/webnlg/m/LoRA-seed0.json": "{}",
                    "results/confirm/runs/e2e/m/LoRA-seed0.json": "{}"}, "a wave-2 run before its rules")
    frozen = commit({"wave2.py": "RULE = 1\n", "profiles.yaml": PROFILES % "0.1"}, "freeze wave 2")
    commit({"results/confirm/claims/wave2_table8_lora_gap_webnlg.json": "{}",
            "results/confirm/runs/adidas/m/Plugin-4L-seed1.json": "{}"}, "results after the freeze")
    problems = freeze.check_wave2(repo, frozen, ["wave2.py"])
    assert len(problems) == 1 and "webnlg/m/LoRA-seed0.json" in problems[0] and early[:10] in problems[0]
    commit({"wave2.py": "RULE = 2\n"}, "rules adjusted after the numbers")
    assert any("wave2.py differs" in p for p in freeze.check_wave2(repo, frozen, ["wave2.py"]))


def _comparison(draws: dict[str, np.ndarray], effect: dict[str, float]) -> dict:
    return {"draws": draws, "effect": effect, "difference": {m: float(np.mean(d)) for m, d in draws.items()},
            "resamples": len(next(iter(draws.values()))), "n_inputs": 200, "seeds": [0, 1, 2]}


def test_a_significant_deficit_disqualifies_direction_only():
    """Adidas, Plugin against NewModel, in miniature: ahead on most of the seven means, significantly
    behind on BLEU. Wave 1 says "direction only"; wave 2 says "not reproduced"."""
    rng = np.random.default_rng(0)
    noise = {m: rng.normal(0.002, 0.01, 500) for m in pre.BOOTSTRAP_METRICS}
    behind = {**noise, "BLEU": rng.normal(-0.02, 0.003, 500)}
    effect = {m: 0.01 for m in METRIC_NAMES} | {"BLEU": -0.02, "CIDEr": -0.01}
    comparison = _comparison(behind, effect)
    assert pre.superiority(comparison)["verdict"] == pre.DIRECTION_ONLY
    result = wave2.superiority_without_deficit(comparison)
    assert result["verdict"] == pre.NOT_REPRODUCED and list(result["behind on"]) == ["BLEU"]
    assert "significantly behind on BLEU" in result["why"]
    # Without the deficit the wave-1 verdict stands; a reproduced comparison keeps its verdict and shows it.
    assert wave2.superiority_without_deficit(_comparison(noise, effect))["verdict"] == pre.DIRECTION_ONLY
    ahead = {m: rng.normal(0.05, 0.005, 500) for m in pre.BOOTSTRAP_METRICS}
    mostly = wave2.superiority_without_deficit(_comparison({**ahead, "NIST": rng.normal(-0.3, 0.05, 500)}, effect))
    assert mostly["verdict"] == pre.REPRODUCED and list(mostly["behind on"]) == ["NIST"]


def test_every_wave2_claim_has_a_unique_key_a_group_and_its_rule():
    keys = [c.key for c in wave2.CLAIMS]
    assert len(keys) == len(set(keys)) == 15 and not set(keys) & {c.key for c in pre.CLAIMS}
    assert {c.dataset for c in wave2.CLAIMS} == set(wave2.DATASETS)
    assert {wave2.group(c) for c in wave2.CLAIMS} == set(wave2.GROUPS)
    for c in wave2.CLAIMS:
        text = wave2.rule_text(c)
        assert ("deficit" in text) == (c.test == "superiority") and (("Premise" in text) == bool(c.premise))
    assert wave2.deeper_labels() == ["Plugin-2L", "Plugin-4L", "Plugin-8L"]


def test_a_row_takes_the_weakest_measurable_verdict():
    assert wave2.row_verdict([pre.REPRODUCED, pre.NOT_MEASURABLE, pre.DIRECTION_ONLY]) == pre.DIRECTION_ONLY
    assert wave2.row_verdict([pre.NOT_MEASURABLE] * 3) == pre.NOT_MEASURABLE
    assert wave2.row_verdict([pre.REPRODUCED, pre.NOT_REPRODUCED]) == pre.NOT_REPRODUCED


def test_the_wave_runs_the_confirm_profiles_own_units_on_its_three_datasets():
    """The units are the notebooks' own at the unchanged profile (so their records are keyed as a
    confirm run of those notebooks would be), without BDPL's learning-budget search or the 12-layer
    and pretrained models; the main tables' Plugin and Zeroshot are among them, already stored."""
    import real_data
    from plugin_lib.commands import confirmation_wave2
    from plugin_lib.harness.profile import load_profile

    real_data.require("webnlg", "commongen", "adidas")
    units = confirmation_wave2.units(load_profile("confirm"))
    keys = [u.key for u in units]
    assert {u.task.dataset for u in units} == set(wave2.DATASETS)
    assert not [k for k in keys if "learning-budget" in k or "12L" in k or "pretrained" in k]
    for dataset in wave2.DATASETS:
        mine = [k for k in keys if f"/{dataset}/" in f"/{k}"]
        for label in ("LoRA", *wave2.deeper_labels(), "Plugin", "Zeroshot"):
            assert any(k.endswith(f"/{label}-seed0") for k in mine), (dataset, label)
    # BDPL's unit per dataset and seed: its prompt, then the BDPL and BDPL + Plugin runs on it
    assert sorted(k.rsplit("/", 4)[-4] for k in keys if "bdpl-prompts" in k) == sorted(wave2.DATASETS * 3)
