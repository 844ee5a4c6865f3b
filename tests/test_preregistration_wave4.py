"""The fourth preregistered wave (issue 73): its frozen rules on constructed comparisons and
records, the check that git history shows those rules before every wave-4 result, and its inputs."""
import numpy as np
import pytest

from plugin_lib.metrics import METRIC_NAMES
from plugin_lib.report import freeze, preregistered as pre, preregistered_wave2 as wave2
from plugin_lib.report import preregistered_wave3 as wave3, preregistered_wave4 as wave4

from test_preregistration import PROFILES, history  # noqa: F401 - the fixture
from test_preregistration_wave3 import AHEAD, NOISE, _comparison

WAVE4_PROFILES = PROFILES + """  wave4:
    base_models: [m]
    ablations: {model: m}
    api: {model: m, compare: m}
    shift: {model: null}
    grid: {lr: [%s]}
"""


def test_git_history_shows_the_wave4_rules_before_every_wave4_result():
    try:
        problems = freeze.check_wave4()
    except freeze.HistoryUnavailable as why:
        pytest.skip(f"no git history to check: {why}")
    assert problems == []


def test_the_wave4_check_flags_early_results_changed_rules_and_a_changed_profile(history):  # noqa: F811
    repo, commit = history
    early = commit({"results/wave4/runs/e2e/m/ProxyTuning-pretrained-seed0.json": "{}"}, "a run before its rules")
    frozen = commit({"wave4.py": "RULE = 1\n", "profiles.yaml": WAVE4_PROFILES % ("0.1", "0.1")}, "freeze wave 4")
    commit({"results/wave4/claims/wave4_pretrained_init_adidas.json": "{}"}, "a result after the freeze")
    check = dict(repo=repo, frozen_at=frozen, files=["wave4.py"], profiles="profiles.yaml")
    problems = freeze.check_wave4(**check)
    assert len(problems) == 1 and "ProxyTuning-pretrained-seed0.json" in problems[0] and early[:10] in problems[0]
    commit({"profiles.yaml": WAVE4_PROFILES % ("0.1", "0.2")}, "the wave's profile changed after the freeze")
    assert any("'wave4' profile" in p and "wave-4 freezing commit" in p for p in freeze.check_wave4(**check))
    commit({"wave4.py": "RULE = 2\n", "profiles.yaml": WAVE4_PROFILES % ("0.1", "0.1")}, "the rules adjusted")
    assert [p for p in freeze.check_wave4(**check) if "wave4.py differs from the wave-4 freezing commit" in p]


def test_every_wave4_claim_has_a_unique_key_a_group_and_a_rule():
    keys = [c.key for c in wave4.CLAIMS]
    assert len(keys) == len(set(keys)) == 17
    assert not set(keys) & {c.key for c in (*pre.CLAIMS, *wave2.CLAIMS, *wave3.CLAIMS)}
    assert {wave4.group(c) for c in wave4.CLAIMS} == set(wave4.GROUPS)
    assert all(wave4.rule_text(c) for c in wave4.CLAIMS)
    assert wave4.rule_text(wave4.claim("wave4_proxy_one_layer_adidas")).startswith("Premise: per rival")
    assert "one comparison" in wave4.rule_text(wave4.claim("wave4_proxy_same_model_e2e"))
    assert "deficit" in wave4.rule_text(wave4.claim("wave4_pretrained_init_webnlg"))
    with pytest.raises(ValueError, match="No wave-4 claim"):
        wave4.claim("wave4_nothing")


def _runs(predictions_per_seed, ids=("a", "b")):
    return [{"seed": s, "test_ids": list(ids), "predictions": p} for s, p in enumerate(predictions_per_seed)]


def test_two_arms_decode_alike_only_on_every_input_of_every_seed():
    same = [["x", "y"], ["x", "z"]]
    assert wave4.same_outputs(_runs(same), _runs(same)[::-1])
    assert not wave4.same_outputs(_runs(same), _runs([["x", "y"], ["x", "y"]]))
    assert not wave4.same_outputs(_runs(same), _runs(same[:1]))  # a seed missing
    assert not wave4.same_outputs(_runs(same), _runs(same, ids=("b", "a")))


def test_the_rivals_left_by_the_premise_and_the_one_comparison_rule():
    held, failed = {"holds": True}, {"holds": False}
    both = wave4.proxy_rivals({r: held for r in wave4.PROXY_RIVALS}, {"DExperts-pretrained": False})
    assert both == {"compared": list(wave4.PROXY_RIVALS), "left out": {}}
    one = wave4.proxy_rivals({r: held for r in wave4.PROXY_RIVALS}, {"DExperts-pretrained": True})
    assert one["compared"] == ["ProxyTuning-pretrained"] and "one comparison" in one["left out"]["DExperts-pretrained"]
    proxy_failed = wave4.proxy_rivals({"ProxyTuning-pretrained": failed, "DExperts-pretrained": held}, {})
    assert proxy_failed["compared"] == ["DExperts-pretrained"]
    assert "premise failed" in proxy_failed["left out"]["ProxyTuning-pretrained"]
    none = wave4.proxy_rivals({r: failed for r in wave4.PROXY_RIVALS}, {})
    assert wave4.judge_proxy(none, {})["verdict"] == pre.NOT_MEASURABLE


def test_a_proxy_claim_is_the_weakest_comparison_with_wave2s_deficit_rule():
    both = wave4.proxy_rivals({r: {"holds": True} for r in wave4.PROXY_RIVALS}, {})
    judged = wave4.judge_proxy(both, {"ProxyTuning-pretrained": AHEAD, "DExperts-pretrained": NOISE})
    assert judged["verdict"] == pre.DIRECTION_ONLY
    assert [c["versus"] for c in judged["comparisons"]] == ["vs ProxyTuning-pretrained", "vs DExperts-pretrained"]
    rng = np.random.default_rng(4)
    behind = _comparison({**NOISE["draws"], "BLEU": rng.normal(-0.02, 0.003, 500)}, NOISE["effect"])
    assert wave4.judge_proxy(both, {"ProxyTuning-pretrained": AHEAD, "DExperts-pretrained": behind}
                             )["verdict"] == pre.NOT_REPRODUCED
    assert wave4.judge_superiority([AHEAD])["verdict"] == pre.REPRODUCED


def test_an_arms_premise_reads_its_alpha_search():
    runs = [{"seed": s, "hparams": {"alpha": 0.05}, "training": {"alpha_hyper_losses": {"0": 2.5, "0.05": loss}}}
            for s, loss in enumerate((2.4, 2.45, 2.5))]
    found = wave4.expert_helps(runs)
    assert found["holds"] and found["seeds helped"] == 2
    assert not wave4.expert_helps(runs[1:])["holds"]


@pytest.mark.parametrize("dataset", wave4.PROXY_DATASETS)
def test_wave4s_inputs_are_the_frozen_ones_and_no_other_profile_decodes_or_trains_on_them(dataset):
    import real_data
    from plugin_lib.experiments import confirmation
    from plugin_lib.harness import tasks
    from plugin_lib.harness.profile import load_profile

    real_data.require(dataset)
    profile = load_profile(wave4.PROFILE)
    confirmation.check_test_inputs(dataset, profile)
    train, hyper, test = tasks.task_splits(dataset, profile)
    ids = [ex.id for ex in test]
    assert len(ids) == wave4.INPUTS[dataset] and ids == confirmation.frozen_inputs(wave4.PROFILE)[dataset]["ids"]
    for other in ("local", "confirm", "wave3"):
        other_train, other_hyper, other_test = tasks.task_splits(dataset, load_profile(other))
        assert not set(ids) & {ex.id for ex in other_train + other_hyper + other_test}
    seen = {" ".join(r.split()) for ex in train + hyper for r in ex.references}
    assert not any(" ".join(r.split()) in seen for ex in test for r in ex.references)


def test_wave4s_units_are_the_pretrained_arms_the_two_bases_and_plugin_4l():
    import real_data
    from plugin_lib.commands import confirmation_wave4
    from plugin_lib.harness.profile import load_profile

    real_data.require()
    units = confirmation_wave4.units(load_profile(wave4.PROFILE))
    runs = [u for u in units if u.kind == "run"]
    labels = {u.label for u in runs}
    assert labels == {"Zeroshot", "Plugin", "NewModel-pretrained", "ProxyTuning-pretrained", "DExperts-pretrained",
                      "Plugin-pretrained", "Plugin-4L"}
    finetuned = [u for u in runs if u.task.checkpoint]
    assert {u.task.dataset for u in finetuned} == set(wave4.FIGURE_DATASETS)
    assert all(u.task.model.endswith("-5ep") for u in finetuned)
    assert len([u for u in units if u.kind == "finetune"]) == 3
    assert len(runs) == 4 * (1 + 3 * 5) + 3 * (3 + 4)  # proxy arms; Plugin-4L and the 5-epoch base's runs


@pytest.fixture
def wave4_store(tmp_path, monkeypatch):
    """The wave4 profile with its results in tmp_path, its frozen test ids answered by made-up
    references, and a helper that stores a label's runs (``good``: inputs answered with their
    reference) on the datasets given, on the original base or the 5-epoch one."""
    import json

    from plugin_lib.commands import confirmation_wave4
    from plugin_lib.experiments import confirmation
    from plugin_lib.harness.running import run_store
    from plugin_lib.harness.profile import load_profile

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    frozen = {d: confirmation.frozen_inputs(wave4.PROFILE)[d]["ids"] for d in wave4.PROXY_DATASETS}
    refs = {i: [f"the {k % 7} blue {k} cats sat on mat {k // 3} near river {k % 11}"] for ids in frozen.values()
            for k, i in enumerate(ids)}
    monkeypatch.setattr(confirmation_wave4, "references", lambda dataset, ids: [refs[i] for i in ids])
    monkeypatch.setattr(confirmation, "references", lambda dataset, ids: [refs[i] for i in ids])
    profile = load_profile(wave4.PROFILE)
    roles = confirmation.Roles(profile)

    def put(label, good, datasets=wave4.PROXY_DATASETS, tuned=False, alpha_losses=None):
        for dataset in datasets:
            ids = frozen[dataset]
            model = roles.finetuned_folder(dataset, 5) if tuned else profile.base_models[0]
            folder = run_store.runs_dir(profile, dataset, model)
            folder.mkdir(parents=True, exist_ok=True)
            share = good if isinstance(good, float) else good / 200
            predictions = [refs[i][0] if n < share * len(ids) else "completely unrelated words here"
                           for n, i in enumerate(ids)]
            for seed in profile.seeds[:1] if label == "Zeroshot" else profile.seeds:
                record = {"dataset": dataset, "model": model, "method": label, "seed": seed, "test_ids": ids,
                          "predictions": predictions, "metrics": dict.fromkeys(METRIC_NAMES, share),
                          "training": {"alpha_hyper_losses": alpha_losses} if alpha_losses else {},
                          "hparams": {"alpha": 0.05} if alpha_losses else {}}
                (folder / f"{label}-seed{seed}.json").write_text(json.dumps(record))

    return profile, put


def test_wave4_waits_for_its_runs_then_judges_every_claim_under_the_frozen_rules(wave4_store):
    import real_data
    from plugin_lib.commands import confirmation_wave4
    from plugin_lib.report import wave4_rows

    real_data.require()
    profile, put = wave4_store
    put("Plugin", 150)
    state = confirmation_wave4.status(profile).set_index("claim")["state"]
    assert state["wave4_proxy_one_layer_e2e"].startswith("waiting")
    helps, too_little = {"0": 2.5, "0.05": 2.3, "1": 2.9}, {"0": 2.5, "0.05": 2.495, "1": 2.9}
    put("ProxyTuning-pretrained", 60, alpha_losses=helps)
    put("DExperts-pretrained", 60, alpha_losses=too_little)  # decodes alike, and its expert helps too little
    put("Plugin-pretrained", 120)
    put("Plugin-4L", 140, wave4.FIGURE_DATASETS)
    put("Zeroshot", 40)
    put("Zeroshot", 80, wave4.FIGURE_DATASETS, tuned=True)
    put("Plugin", 190, wave4.FIGURE_DATASETS, tuned=True)
    verdicts = {c["key"]: c for c in confirmation_wave4.judge(profile)}
    assert len(verdicts) == len(wave4.CLAIMS)
    one_layer = verdicts["wave4_proxy_one_layer_webnlg"]
    assert one_layer["verdict"] == pre.REPRODUCED, one_layer["statistic"]["summary"]
    assert one_layer["statistic"]["frozen_at"] == freeze.WAVE4_FROZEN_AT
    assert "DExperts-pretrained left out: the same outputs" in one_layer["statistic"]["summary"]
    assert [r["versus"] for r in one_layer["statistic"]["result"]["comparisons"]] == ["vs ProxyTuning-pretrained"]
    assert verdicts["wave4_base_quality_adidas"]["verdict"] == pre.REPRODUCED
    assert verdicts["wave4_plugin_beats_base_commongen"]["verdict"] == pre.REPRODUCED
    # Plugin-pretrained behind Plugin-4L on every metric: not reproduced.
    assert verdicts["wave4_pretrained_init_webnlg"]["verdict"] == pre.NOT_REPRODUCED
    assert verdicts["wave4_proxy_same_model_e2e"]["statistic"]["n"] == {"inputs": 200, "seeds": 3}
    assert verdicts["wave4_proxy_same_model_adidas"]["statistic"]["n"]["inputs"] == 54
    # Proxy-tuning's expert no longer helps, and DExperts decodes otherwise but helps too little: no rival left.
    put("ProxyTuning-pretrained", 60, alpha_losses=too_little)
    put("DExperts-pretrained", 61, alpha_losses=too_little)
    again = confirmation_wave4.judge(profile, keys=["wave4_proxy_one_layer_e2e"])[0]
    assert again["verdict"] == pre.NOT_MEASURABLE and again["statistic"]["summary"].startswith("no rival left")
    # The group's rows name the rivals left out, where and why.
    statistic = wave4_rows.row("proxy_one_layer")[1]
    assert statistic.endswith("; proxy-tuning left out on e2e (its expert did not help); DExperts left out on e2e "
                              "(its expert did not help); DExperts = proxy-tuning on webnlg, commongen, adidas "
                              "(the same outputs)"), statistic
    assert "e2e, webnlg, commongen, adidas (the same outputs)" in wave4_rows.row("proxy_same_model")[1]
    # Fine-tuning that did not improve the base alone: Figure 2's trend is not measurable.
    put("Zeroshot", 30, wave4.FIGURE_DATASETS, tuned=True)
    trend = confirmation_wave4.judge(profile, keys=["wave4_base_quality_webnlg"])[0]
    assert trend["verdict"] == pre.NOT_MEASURABLE and trend["statistic"]["summary"].startswith("premise fails")
