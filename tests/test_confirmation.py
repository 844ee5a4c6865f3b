"""experiments.confirmation: the frozen rules applied to a confirm store (made-up runs)."""
import dataclasses
import json
from pathlib import Path

import pytest

from plugin_lib.experiments import confirmation
from plugin_lib.report import claim_summary
from plugin_lib.harness.baselines import bdpl
from plugin_lib.harness.running import run_keys, run_store, search
from plugin_lib.harness.machine import results_dir
from plugin_lib.harness.profile import load_profile
from plugin_lib.metrics import METRIC_NAMES
from plugin_lib.report import freeze
from plugin_lib.report.claims import record_claim

from conftest import FAKE_REFERENCES

import real_data

IDS = list(FAKE_REFERENCES)
ROOT = Path(__file__).resolve().parents[1]
BASE = "smollm2-135m-instruct"


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The confirm profile with its results in tmp_path and the made-up inputs' references; a
    helper that stores a method's runs (``good``: inputs answered with their reference)."""
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(confirmation, "references", lambda dataset, ids: [FAKE_REFERENCES[i] for i in ids])
    profile = load_profile("confirm")

    def put(label, good, seeds=(0, 1, 2), dataset="e2e", model=BASE, score=None):
        folder = run_store.runs_dir(profile, dataset, model)
        folder.mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            predictions = [FAKE_REFERENCES[i][0] if n < good else "completely unrelated words here"
                           for n, i in enumerate(IDS)]
            value = good / len(IDS) if score is None else score
            record = {"dataset": dataset, "model": model, "method": label, "seed": seed, "test_ids": IDS,
                      "predictions": predictions, "metrics": dict.fromkeys(METRIC_NAMES, value)}
            (folder / f"{label}-seed{seed}.json").write_text(json.dumps(record))

    return profile, put


def put_bdpl_prompts(profile, prefix, hyper_reward, top_prob, budget=75):
    """Stores BDPL's learned prompt for every seed at one API-call budget (75: the paper's);
    the hyper-validation reward without a prefix is -2.2 throughout."""
    for seed in profile.seeds:
        path = bdpl.prompt_path(profile, "e2e", BASE, seed, budget)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "seed": seed, "prefix": prefix, "hyper_reward": hyper_reward, "hyper_reward_no_prefix": -2.2,
            "top_probs": [top_prob] * 6, "bdpl": {"num_candidates": 50}}))


def test_a_claim_waits_for_its_runs_then_is_judged_and_recorded(store):
    real_data.require()  # the status of every claim reads the datasets (e.g. Adidas' training words)
    profile, put = store
    put("Plugin", 12)
    put("Zeroshot", 2, seeds=(0,))
    state = confirmation.status(profile, check_inputs=False).set_index("claim")
    assert state.loc["main_e2e", "state"].startswith("waiting: e2e/smollm2-135m-instruct: no ICL-1 run")
    assert state.loc["complexity_e2e_0", "state"] == "ready"
    for label in ("ICL-1", "ICL-3", "NewModel", "WeightedComb", "TempNet"):
        put(label, 3)
    recorded = {c["key"]: c for c in confirmation.judge(profile, keys=["main_e2e", "complexity_e2e_0"],
                                                        check_inputs=False)}
    assert recorded["main_e2e"]["verdict"] == "reproduced"
    stored = json.loads((results_dir(profile) / "claims" / "main_e2e.json").read_text())
    assert stored["preregistered"] and stored["statistic"]["frozen_at"] == freeze.FROZEN_AT
    assert "two-level paired bootstrap" in stored["rule"]
    assert len(stored["statistic"]["result"]["comparisons"]) == 6  # one per baseline


def test_a_partial_seed_set_waits(store):
    real_data.require()  # the status of every claim reads the datasets (e.g. Adidas' training words)
    profile, put = store
    put("Plugin", 12, seeds=(0, 1))
    put("Zeroshot", 2, seeds=(0,))
    state = confirmation.status(profile, check_inputs=False).set_index("claim")
    assert "seeds [0, 1] of [0, 1, 2]" in state.loc["complexity_e2e_0", "state"]


def test_a_trained_method_with_only_its_first_seed_waits(store):
    """One run is complete only for a deterministic method (Zeroshot): a Plugin with seed 0
    alone stored is not judged on that seed."""
    profile, put = store
    roles = confirmation.Roles(profile, check_inputs=False)
    put("Plugin", 12, seeds=(0,))
    put("Zeroshot", 2, seeds=(0,))
    assert len(roles.runs("e2e", "Zeroshot")) == 1
    with pytest.raises(confirmation.Missing, match=r"Plugin: seeds \[0\] of \[0, 1, 2\]"):
        roles.runs("e2e", "Plugin")
    put("Zeroshot", 2, seeds=(1,))
    with pytest.raises(confirmation.Missing, match=r"Zeroshot: seeds \[0, 1\] of \[0\]"):
        roles.runs("e2e", "Zeroshot")


def test_more_layers_compares_every_deeper_model_with_one_layer(store):
    profile, put = store
    put("Plugin", 8)
    for k in (2, 4, 8, 12):
        put(f"Plugin-{k}L", 8)
    (claim,) = confirmation.judge(profile, keys=["complexity_e2e_1"], check_inputs=False)
    assert claim["verdict"] == "reproduced"  # equal to one layer: within every margin
    assert len(claim["statistic"]["result"]["comparisons"]) == 4


def test_runs_on_other_test_inputs_are_refused(store):
    profile, put = store
    put("Plugin", 8)
    with pytest.raises(ValueError, match="not on the frozen test inputs"):
        confirmation.stored_runs(profile, "e2e", BASE, "Plugin")


def test_bdpl_without_learning_is_not_measurable(store):
    profile, put = store
    put_bdpl_prompts(profile, prefix="a b", hyper_reward=-2.18, top_prob=0.0203)
    put("Plugin", 10)
    put("BDPL", 2)
    (claim,) = confirmation.judge(profile, keys=["table5_plugin_vs_bdpl"], check_inputs=False)
    assert claim["verdict"] == "not measurable at this scale"
    assert claim["statistic"]["summary"].startswith("premise fails: seed 0: gain +0.020")


def test_a_failed_premise_is_ready_to_judge_without_the_runs_it_rules_out(store):
    """BDPL that learned nothing makes Table 5's claims not measurable: status must not wait for
    BDPL runs (at a learning budget none are ever made)."""
    from plugin_lib.report import preregistered as pre

    profile, _ = store
    put_bdpl_prompts(profile, prefix="", hyper_reward=-2.2, top_prob=0.0201)
    claim = next(c for c in pre.CLAIMS if c.key == "table5_plugin_vs_bdpl")
    confirmation.gather(confirmation.Roles(profile, check_inputs=False), claim)  # no Missing: ready
    (judged,) = confirmation.judge(profile, keys=[claim.key], check_inputs=False)
    assert judged["verdict"] == "not measurable at this scale"


def test_a_seed_made_from_other_data_waits_and_a_doubled_seed_is_refused(store):
    profile, put = store
    roles = confirmation.Roles(profile, check_inputs=False)
    put("Plugin", 12)
    folder = run_store.runs_dir(profile, "e2e", BASE)
    for seed in profile.seeds:
        record = json.loads((folder / f"Plugin-seed{seed}.json").read_text())
        record["inputs"] = "stale" if seed == 1 else "current"
        (folder / f"Plugin-seed{seed}.json").write_text(json.dumps(record))
    with pytest.raises(confirmation.Missing, match="different inputs"):
        roles.runs("e2e", "Plugin")
    put("Plugin", 12)  # every seed from the same data again
    (folder / "Plugin-seed01.json").write_text((folder / "Plugin-seed1.json").read_text())
    with pytest.raises(ValueError, match=r"more than one stored run of seed\(s\) \[1\]"):
        roles.runs("e2e", "Plugin")


def test_judge_records_the_claims_it_can_and_then_names_the_ones_it_could_not(store, capsys):
    profile, put = store
    put("Plugin", 12)
    put("Zeroshot", 2, seeds=(0,))
    folder = run_store.runs_dir(profile, "e2e", BASE)
    (folder / "Plugin-seed01.json").write_text((folder / "Plugin-seed1.json").read_text())
    with pytest.raises(ValueError, match="1 claim\\(s\\) could not be judged"):
        confirmation.judge(profile, keys=["complexity_e2e_0", "table8_flops"], check_inputs=False)
    assert (results_dir(profile) / "claims" / "table8_flops.json").exists()  # judged after the failure
    assert "complexity_e2e_0: cannot be judged" in capsys.readouterr().err


def test_a_theorem1_table_without_the_frozen_fit_waits(store):
    profile, _ = store
    tables = results_dir(profile) / "tables"
    tables.mkdir(parents=True)
    (tables / "theorem1_slopes.csv").write_text(
        "metric,fit_from_tokens,slope,ci95_low,ci95_high\nexcess_loss,1,-1.0,-1.1,-0.9\n")
    with pytest.raises(confirmation.Missing, match=f"fitted from {profile.theorem1.fit_from} tokens"):
        confirmation.theorem1_slope(profile)


def test_a_notebooks_own_rule_never_lands_among_the_preregistered_claims(store):
    profile, _ = store
    record_claim(profile, "main_e2e", "c", "p", "o", "reproduced", rule="a notebook's rule",
                 statistic={"summary": "s", "n": {}})
    assert (results_dir(profile) / "notebook-claims" / "main_e2e.json").exists()
    assert not (results_dir(profile) / "claims" / "main_e2e.json").exists()


def test_the_learning_budget_is_the_first_at_which_seed_0_learns(store):
    profile, put = store
    for budget, top in ((300, 0.0203), (1200, 0.2)):
        put_bdpl_prompts(profile, prefix="a b", hyper_reward=-2.1, top_prob=top, budget=budget)
    assert bdpl.prompt_path(profile, "e2e", BASE, 0, 1200).name == "calls1200-seed0.json"
    assert bdpl.prompt_path(profile, "e2e", BASE, 0, 75).name == "seed0.json"  # the paper's budget
    assert confirmation.Roles(profile, check_inputs=False).learning_budget() == 1200
    assert bdpl.run_labels(profile, 1200) == ("BDPL@1200calls", "BDPL+Plugin@1200calls")
    put("BDPL@1200calls", 4)
    put("BDPL+Plugin@1200calls", 11)
    (claim,) = confirmation.judge(profile, keys=["table5_bdpl_plugin_learning"], check_inputs=False)
    assert claim["verdict"] == "reproduced" and claim["statistic"]["result"]["premise"]["budget"] == 1200


@pytest.mark.parametrize("dataset", ["e2e", "webnlg", "commongen", "adidas"])
def test_the_fresh_test_inputs_are_the_frozen_ones_and_were_never_decoded(dataset):
    from plugin_lib.harness import tasks
    from plugin_lib.report import stats

    real_data.require(dataset)
    confirm, local = load_profile("confirm"), load_profile("local")
    train, hyper, test = tasks.task_splits(dataset, confirm)
    decoded = {ex.id for ex in tasks.task_splits(dataset, local)[2]}
    ids = [ex.id for ex in test]
    assert ids == confirmation.frozen_inputs()[dataset]["ids"] and len(ids) == 200
    assert not decoded & set(ids)
    seen = {" ".join(r.split()) for ex in train + hyper for r in ex.references}
    assert not any(" ".join(r.split()) in seen for ex in test for r in ex.references)
    assert stats._references(dataset, tuple(ids[:3])) == [list(ex.references) for ex in test[:3]]


def test_test_inputs_other_than_the_frozen_ones_are_refused_before_any_run():
    real_data.require("e2e")
    confirmation.check_test_inputs("e2e", load_profile("confirm"))  # the frozen ones: no error
    with pytest.raises(ValueError, match="differ from the frozen ones"):  # the exploratory inputs, as confirm's
        confirmation.check_test_inputs("e2e", dataclasses.replace(load_profile("confirm"), test_inputs=None))
    with pytest.raises(ValueError, match="has no frozen test inputs"):
        confirmation.check_test_inputs("e2e", load_profile("local"))


def test_a_claim_of_several_comparisons_is_summed_up_by_its_weakest_named_one(store):
    profile, put = store
    put("Plugin", 12)
    put("Zeroshot", 2, seeds=(0,))
    for label, good in (("ICL-1", 10), ("ICL-3", 3), ("NewModel", 3), ("WeightedComb", 3), ("TempNet", 3)):
        put(label, good)
    (claim,) = confirmation.judge(profile, keys=["main_e2e"], check_inputs=False)
    rows = claim["statistic"]["result"]["comparisons"]
    assert [r["versus"] for r in rows] == ["vs Zeroshot", "vs ICL-1", "vs ICL-3", "vs NewModel", "vs WeightedComb",
                                           "vs TempNet"]
    assert claim["statistic"]["summary"].startswith("weakest of 6, vs ICL-1: BLEU +")  # the closest rival
    assert claim["statistic"]["summary"].endswith("inputs, 3 seeds")


def test_comparisons_are_named_by_what_varies_among_them():
    def runs(method, model=BASE):
        return [{"method": method, "model": model}]

    deeper = [(runs("Plugin-2L"), runs("Plugin")), (runs("Plugin-4L"), runs("Plugin"))]
    assert claim_summary.versus_labels(deeper) == ["Plugin-2L vs Plugin", "Plugin-4L vs Plugin"]
    tuned = f"{BASE}-e2e-val-outside120-200pairs-6f7d019f2c-5ep"
    bases = [(runs("Plugin"), runs("Zeroshot")), (runs("Plugin", tuned), runs("Zeroshot", tuned))]
    assert claim_summary.versus_labels(bases) == ["on original", "on fine-tuned 5 ep"]
    assert claim_summary.versus_labels([(runs("Plugin", tuned), runs("Plugin"))]) == [
        "Plugin on fine-tuned 5 ep vs on original"]
    assert claim_summary.versus_labels([(runs("Plugin", f"{BASE}@top5-residual"),
                                        runs("Zeroshot", f"{BASE}@top5-residual"))]) == ["vs Zeroshot"]


def sync_script():
    """scripts/sync_confirmation.py as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sync_confirmation", ROOT / "scripts" / "sync_confirmation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sync_copies_finished_records_and_drops_a_selection_still_searching(tmp_path):
    sync = sync_script()
    store, target = tmp_path / "store", tmp_path / "repo"
    runs = store / "runs" / "e2e" / BASE
    (runs / "cache").mkdir(parents=True)
    (runs / "cache" / "rows.json").write_text("{}")
    (runs / "Plugin-seed0.json").write_text('{"seed": 0}')
    (runs / "Plugin-selection.json").write_text('{"configs": {}, "grid": {"lr": [0.001]}}')
    (runs / "TempNet-selection.json").write_text('{"configs": {}}')  # still searching
    (target / "runs" / "e2e" / BASE).mkdir(parents=True)
    (target / "runs" / "e2e" / BASE / "TempNet-selection.json").write_text('{"configs": {}}')  # synced mid-search
    assert sync.sync(store, target) == (2, 1)
    copied = sorted(p.relative_to(target).as_posix() for p in target.rglob("*.json"))
    assert copied == [f"runs/e2e/{BASE}/Plugin-seed0.json", f"runs/e2e/{BASE}/Plugin-selection.json"]
    assert sync.sync(store, target) == (0, 0)  # nothing new
    (store / "figures").mkdir()
    (store / "figures" / "main_e2e.png").write_bytes(b"png")
    (store / "REPORT.md").write_text("# a report of notebook 01 only (run_all.sh --only 01)")
    assert sync.sync(store, target) == (1, 0) and not (target / "REPORT.md").exists()
    assert (target / "figures" / "main_e2e.png").read_bytes() == b"png"
    assert sync.sync(store, target, report=True) == (1, 0) and (target / "REPORT.md").exists()


def test_searches_under_way_are_kept_apart_and_restored_into_a_new_store(tmp_path):
    sync = sync_script()
    store, target, resume = tmp_path / "store", tmp_path / "repo", tmp_path / "repo-resume"
    runs = store / "runs" / "e2e" / BASE
    (runs / "bdpl-prompts").mkdir(parents=True)
    (runs / "Plugin-seed0.json").write_text('{"seed": 0}')
    (runs / "TempNet-selection.json").write_text('{"configs": {"lr=0.001": {}}}')  # still searching
    (runs / "bdpl-prompts" / ".seed0-1200calls.json.partial").write_text('{"state": {"step": 60}}')
    assert sync.sync(store, target) == (1, 0)
    assert sync.save_resume_state(store, resume) == (2, 0)
    kept = sorted(p.relative_to(resume).as_posix() for p in resume.rglob("*") if p.is_file())
    assert kept == [f"runs/e2e/{BASE}/TempNet-selection.json", f"runs/e2e/{BASE}/bdpl-prompts/.seed0-1200calls.json.partial"]
    assert not (target / "runs" / "e2e" / BASE / "TempNet-selection.json").exists()  # results hold only finished ones
    assert sync.save_resume_state(store, resume) == (0, 0)

    # the machine is lost: a new store gets the records and the searches' states, then resumes them
    fresh = tmp_path / "fresh"
    assert sync.restore(target, resume, fresh) == 3
    assert json.loads((fresh / "runs" / "e2e" / BASE / "TempNet-selection.json").read_text())["configs"] == {"lr=0.001": {}}
    newer = fresh / "runs" / "e2e" / BASE / "TempNet-selection.json"
    newer.write_text('{"configs": {"lr=0.001": {}, "lr=0.003": {}}}')
    assert sync.restore(target, resume, fresh) == 0 and "lr=0.003" in newer.read_text()  # the store's own is kept

    # both searches end: their kept states go
    newer.write_text('{"configs": {"lr=0.001": {}, "lr=0.003": {}}, "grid": {"lr": [0.001, 0.003]}}')
    (fresh / "runs" / "e2e" / BASE / "bdpl-prompts" / ".seed0-1200calls.json.partial").unlink()
    (fresh / "runs" / "e2e" / BASE / "bdpl-prompts" / "seed0-1200calls.json").write_text('{"prefix": ""}')
    assert sync.save_resume_state(fresh, resume) == (0, 2)
    assert not [p for p in resume.rglob("*") if p.is_file()]
    assert sync.sync(fresh, target) == (2, 0)


def test_trainings_under_way_are_kept_only_when_asked_and_dropped_once_they_end(tmp_path):
    """--checkpoints: a configuration longer than a session resumes on the next machine from its
    last save; a state too large for git stays on its machine."""
    sync = sync_script()
    store, resume = tmp_path / "store", tmp_path / "repo-resume"
    saves = store / "runs" / "commongen" / BASE / ".checkpoints"
    saves.mkdir(parents=True)
    training = saves / "LoRA-lr=0.0003-weight_decay=0.1-f7baa9cdcc23.pt"
    training.write_bytes(b"state after epoch 4")
    large = saves / "finetune-abc.pt"
    with large.open("wb") as f:
        f.truncate(sync.CHECKPOINT_LIMIT + 1)
    assert sync.save_resume_state(store, resume) == (0, 0)  # not by default: each commit grows the history
    assert sync.save_resume_state(store, resume, checkpoints=True) == (1, 0)
    kept = resume / training.relative_to(store)
    assert kept.read_bytes() == b"state after epoch 4" and not (resume / large.relative_to(store)).exists()
    assert sync.save_resume_state(store, resume) == (0, 0) and kept.exists()  # a plain sync keeps it

    fresh = tmp_path / "fresh"  # the machine is lost: the training resumes from the kept state
    assert sync.restore(tmp_path / "repo", resume, fresh) == 1
    assert (fresh / training.relative_to(store)).read_bytes() == b"state after epoch 4"
    (fresh / training.relative_to(store)).unlink()  # core.train.fit removes it when the training ends
    assert sync.save_resume_state(fresh, resume) == (0, 1) and not kept.exists()


def test_git_keeps_the_search_states_that_the_sync_keeps_and_ignores_them_in_a_store():
    import subprocess

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    prompts = f"runs/e2e/{BASE}/bdpl-prompts/.seed1.json.partial"
    assert not ignored(f"results/confirm-resume/{prompts}")
    assert not ignored(f"results/confirm-resume/runs/e2e/{BASE}/Plugin-MLP-selection.json")
    assert ignored(f"results/confirm/{prompts}") and ignored(f"results/local/{prompts}")
    training = f"runs/e2e/{BASE}/.checkpoints/LoRA-lr=0.001-abc.pt"
    assert not ignored(f"results/confirm-resume/{training}")
    assert ignored(f"results/confirm/{training}") and ignored(f"results/confirm-resume/runs/e2e/{BASE}/cache/rows.pt")


def test_summaries_never_print_a_p_value_as_zero():
    from plugin_lib.report import preregistered as pre

    assert claim_summary.p_text(0.0004997501249375312) == "< 0.001"  # 1/2001, the smallest bootstrap p
    assert claim_summary.p_text(0.0019990004997) == "0.002" and claim_summary.p_text(0.057) == "0.057"
    coverage = next(c for c in pre.CLAIMS if c.key == "adidas_coverage")
    ratio = {"verdict": pre.REPRODUCED, "difference": 0.176, "p": 0.0004997, "ci95": [0.161, 0.191],
             "n": {"inputs": 200, "seeds": 3}}
    assert claim_summary.summary(coverage, ratio) == "share +0.176 (p < 0.001, 95% CI +0.161..+0.191); 200 inputs, 3 seeds"


def test_a_summary_names_only_the_sizes_a_claim_has():
    from plugin_lib.report import preregistered as pre

    theorem = next(c for c in pre.CLAIMS if c.key == "theorem1")
    slope = {"verdict": pre.REPRODUCED, "slope": -1.006, "ci95": [-1.029, -0.984], "n": {"inputs": None, "seeds": 10}}
    assert claim_summary.summary(theorem, slope) == "slope -1.006 (95% CI -1.029..-0.984); 10 seeds"


def test_the_sync_never_replaces_a_committed_claim_and_puts_it_back_into_the_store(tmp_path):
    sync = sync_script()
    store, target = tmp_path / "store", tmp_path / "repo"
    (store / "claims").mkdir(parents=True)
    (target / "claims").mkdir(parents=True)
    (target / "claims" / "main_e2e.json").write_text('{"slope": -1.0062694}')
    (store / "claims" / "main_e2e.json").write_text('{"slope": -1.0062743}')  # judged again elsewhere
    (store / "claims" / "theorem1.json").write_text('{"slope": -1.0}')  # judged for the first time
    assert sync.keep_committed_claims(store, target) == ["main_e2e"]
    assert (store / "claims" / "main_e2e.json").read_text() == '{"slope": -1.0062694}'
    assert sync.sync(store, target) == (1, 0)
    assert (target / "claims" / "main_e2e.json").read_text() == '{"slope": -1.0062694}'
    assert (target / "claims" / "theorem1.json").read_text() == '{"slope": -1.0}'
    assert sync.keep_committed_claims(store, target) == []


def search_config_script():
    """scripts/train_search_config.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_search_config", ROOT / "scripts" / "train_search_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("method,optimum", [("LoRA", {"lr": -2.2, "weight_decay": 0.7}),
                                            ("LoRA", {"lr": -5.0, "weight_decay": -1.0}),
                                            ("WeightedComb", {"lr": -3.4, "weight_decay": 3.0, "alpha": 0.9})])
def test_the_script_replays_the_coordinate_searchs_own_walk(tmp_path, monkeypatch, method, optimum):
    """Each configuration search.select_hparams trains is, when it trains it, on the axis the
    script finds from the losses recorded before; at the end nothing is left. Made-up losses
    (a bowl, its bottom inside the grid or past its edges) stand in for trainings."""
    import math

    script = search_config_script()
    profile = load_profile("confirm")
    assert profile.grid.search == "coordinate" and profile.grid.extend_edges > 0
    values = {k: list(getattr(profile.grid, k)) for k in run_keys.grid_keys(method)}
    record = {"settings": "s", "inputs": "i", "configs": {}, "best": None}
    trained = []

    def loss(hparams):
        return sum((hparams[k] - optimum[k]) ** 2 if k == "alpha" else (math.log10(hparams[k]) - optimum[k]) ** 2
                   for k in hparams)

    def fake_training(task, method, profile, configs, **kwargs):
        losses = {tag: c["val_loss"] for tag, c in record["configs"].items()}
        axis = script.coordinate_axis(losses, values, profile.grid.extend_edges)
        for hparams in configs:  # an axis's configurations train together
            if run_keys.config_tag(hparams) in record["configs"]:
                continue
            assert hparams in axis
            trained.append(run_keys.config_tag(hparams))
            record["configs"][run_keys.config_tag(hparams)] = {"hparams": hparams, "val_loss": loss(hparams)}
            if record["best"] is None or loss(hparams) < record["configs"][record["best"]]["val_loss"]:
                record["best"] = run_keys.config_tag(hparams)
        return json.loads(json.dumps(record))

    monkeypatch.setattr(search, "selection_files", lambda *a: run_store.MethodFiles(tmp_path, "s", "i"))
    monkeypatch.setattr(search, "_train_configs", fake_training)
    search.select_hparams(None, method, profile, arch={"layers": 1}, progress=False)
    assert len(trained) > sum(len(v) for v in values.values()) - len(values)  # every axis walked
    losses = {tag: c["val_loss"] for tag, c in record["configs"].items()}
    assert script.coordinate_axis(losses, values, profile.grid.extend_edges) == []


def test_the_script_trains_only_what_the_search_will_train():
    script = search_config_script()
    values = {"lr": [0.0003, 0.001, 0.003], "weight_decay": [0.01, 0.1, 1.0]}
    losses = {"lr=0.001-weight_decay=0.1": 2.05, "lr=0.0003-weight_decay=0.1": 2.04,
              "lr=0.003-weight_decay=0.1": 2.06, "lr=9e-05-weight_decay=0.1": 2.045}  # the lr axis is done
    axis = script.coordinate_axis(losses, values, 3)
    assert axis == [{"lr": 0.0003, "weight_decay": 0.01}, {"lr": 0.0003, "weight_decay": 1.0}]
    assert script.config_on_axis(script.parse_settings(["lr=3e-4", "weight_decay=1"]), axis, "s") == axis[1]
    with pytest.raises(SystemExit, match="not certain to train"):  # off the walk: it could become the best
        script.config_on_axis(script.parse_settings(["lr=1e-3", "weight_decay=1"]), axis, "s")
    with pytest.raises(SystemExit, match="not a number"):
        script.parse_settings(["lr=fast"])
    assert script.coordinate_axis({**losses, "lr=0.0003-weight_decay=0.01": 2.1, "lr=0.0003-weight_decay=1": 2.1},
                                  values, 3) == []  # 0.1 chosen inside the grid: the walk is complete


def test_a_configuration_trained_ahead_is_the_grids_own_unit_of_it():
    """The script's unit for a configuration equals the `config` unit the grid makes for a full-grid
    search (smoke's): it trains with the search's own function, key and label."""
    from plugin_lib.harness import grid

    script = search_config_script()
    profile = load_profile("smoke")
    units = grid.table_units("e2e", profile, "01")
    selections = [u for u in units if u.kind == "selection"]
    assert {u.method for u in selections} >= {"Plugin", "WeightedComb"}
    for selection in selections:
        hparams = {k: getattr(profile.grid, k)[0] for k in run_keys.grid_keys(selection.method)}
        (own,) = [u for u in units if u.kind == "config" and u.key in selection.needs]
        assert script.config_unit(selection, hparams) == dataclasses.replace(own, needs=())


def test_fresh_from_takes_one_profile_or_several_and_refuses_anything_else():
    from plugin_lib.harness.profile import TestInputs, validated

    spec = {"seed": 1, "fill_from_validation": True, "dedupe_references": True}
    assert validated({**spec, "fresh_from": "local"}, TestInputs, "t").profiles == ("local",)
    assert validated({**spec, "fresh_from": ["local", "confirm"]}, TestInputs, "t").profiles == ("local", "confirm")
    with pytest.raises(ValueError, match="fresh_from"):
        validated({**spec, "fresh_from": 3}, TestInputs, "t")
