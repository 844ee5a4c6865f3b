"""The grid's units and their plan (harness.grid): units made from the notebooks' job lists, one
unit per record in every profile, choosing and skipping units, list-scheduled wall time, the
cost model's likely estimate calibrated by stored records, and the keys the plan computes
against the executing worker's. Execution on real engines is tests/test_grid.py."""
from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest

from plugin_lib.commands import studies
from plugin_lib.commands.grid import print_plan
from plugin_lib.harness import grid
from plugin_lib.harness.grid import executors, plan as planning
from plugin_lib.harness.planning import costs
from plugin_lib.harness.planning.preflight_counts import TaskCounts
from plugin_lib.harness.profile import load_profile
from plugin_lib.harness.running import run_keys, run_store, runner, search

sys.path.insert(0, str(Path(__file__).parent))
import real_data  # noqa: E402


def test_the_table_units_are_the_notebooks_runs_and_their_needs():
    profile = load_profile("smoke")
    units = grid.table_units("e2e", profile, "01")
    runs = [(u.method, u.seed) for u in units if u.kind == "run"]
    assert runs == runner.table_jobs(profile)["smollm2-135m-instruct"]  # run_table's own list, in its order
    by_key = {u.key: u for u in units}
    assert len(by_key) == len(units)
    folder = "runs/e2e/smollm2-135m-instruct"
    assert by_key[f"{folder}/TempNet-greedy-seed0"].needs == (f"{folder}/Zeroshot-seed0",)
    assert by_key[f"{folder}/Plugin-seed0"].needs == (f"{folder}/Plugin-selection",)
    selection = by_key[f"{folder}/WeightedComb-selection"]
    configs = [k for k in selection.needs if by_key[k].kind == "config"]
    assert len(configs) == len(run_keys.hparam_grid(profile, "WeightedComb"))
    assert by_key[configs[0]].needs == (f"{folder}/cache",)
    assert by_key[f"{folder}/Zeroshot-seed0"].needs == ()


def test_notebooks_share_units_and_the_plan_orders_them(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    profile = load_profile("smoke")
    units = studies.units(profile, ["01", "07", "11"])
    keys = [u.key for u in units]
    assert len(keys) == len(set(keys))
    shared = {u.key: u.notebooks for u in units}["runs/e2e/smollm2-135m-instruct/Zeroshot-seed0"]
    assert set(shared) == {"01_table1_e2e", "07_fig3_reweighting_complexity", "11_table8_lora"}
    assert {"Plugin-2L-selection", "LoRA-seed0"} <= {k.rsplit("/", 1)[-1] for k in keys}
    order = [u.key for u in planning.topological(units)]
    assert all(order.index(n) < order.index(u.key) for u in units for n in u.needs)
    with pytest.raises(ValueError, match="matches no notebook"):
        studies.units(profile, ["99"])
    assert {s.notebook for s in studies.STUDIES if s.units} >= {"01_table1_e2e", "12_topk_logprobs"}


def _unit(key, needs=()):
    return grid.Unit("run", key, grid.TaskRef("smollm2-135m-instruct", "e2e"), load_profile("smoke"), needs=needs)


def test_units_can_be_chosen_and_skipped_by_key_with_their_dependencies():
    from plugin_lib.commands.grid import select_units

    # a -> c -> e, b -> c, d alone
    units = [_unit("x/a"), _unit("x/b"), _unit("x/c", ("x/a", "x/b")), _unit("y/d"), _unit("x/e", ("x/c",))]
    keys = lambda chosen: [u.key for u in chosen]
    assert keys(select_units(units)) == ["x/a", "x/b", "x/c", "y/d", "x/e"]
    assert keys(select_units(units, ["*/c"])) == ["x/a", "x/b", "x/c"]  # with what it needs
    assert keys(select_units(units, skip=["x/b"])) == ["x/a", "y/d"]  # c and e would compute b
    assert keys(select_units(units, ["x/*"], ["x/e"])) == ["x/a", "x/b", "x/c"]
    with pytest.raises(ValueError, match="matches no unit"):
        select_units(units, ["z/*"])
    with pytest.raises(ValueError, match="leaves no unit"):
        select_units(units, ["x/c"], ["x/a"])


def test_wall_time_is_list_scheduling_over_the_dependency_graph():
    # a -> c, b -> c, d alone: 4 units of 10, 10, 30, 5 seconds
    units = [_unit("a"), _unit("b"), _unit("c", ("a", "b")), _unit("d")]
    plan = grid.Plan(units, state=dict.fromkeys("abcd", "ready"), seconds={"a": 10, "b": 10, "c": 30, "d": 5})
    assert plan.critical_path() == (40, ["a", "c"])
    assert plan.wall_seconds(1) == 55  # everything in turn
    assert plan.wall_seconds(2) == 40  # the critical path; d fits beside it
    assert plan.wall_seconds(32) == 40
    plan.state["a"] = "done"
    assert plan.critical_path()[0] == 40  # b then c
    assert planning.gpu_share(10 * 2**30, 80 * 2**30) == 0.125 and planning.gpu_share(90 * 2**30, 80 * 2**30) == 1.0


def test_slurm_stages_follow_the_dependencies_and_batches_keep_one_base():
    units = [_unit("a"), _unit("b"), _unit("c", ("a", "b")), _unit("d", ("c",))]
    assert [[u.key for u in s] for s in executors.stages(units)] == [["a", "b"], ["c"], ["d"]]
    other = grid.Unit("run", "e", grid.TaskRef("gpt2-medium", "e2e"), load_profile("smoke"))
    assert [[u.key for u in b] for b in executors.batches(units[:2] + [other], 1)] == [["a"], ["b"], ["e"]]
    assert [[u.key for u in b] for b in executors.batches(units[:2] + [other], 8)] == [["a", "b"], ["e"]]


def test_stored_selections_calibrate_a_likely_estimate_below_the_upper_bound(tmp_path, monkeypatch):
    from plugin_lib.harness.machine import results_dir

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    profile = load_profile("confirm")  # a coordinate search of up to 4 x 3 x 3 configurations of 40 epochs
    assert planning.calibration(profile) is None  # nothing stored yet
    folder = results_dir(profile) / "runs" / "e2e" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    for name, epochs in (("Plugin", [6, 10]), ("NewModel", [8, 8, 14]), ("TempNet", [40, 10, 6, 6])):
        configs = {f"lr={i}": {"epochs_run": e, "val_loss": 1.0} for i, e in enumerate(epochs)}
        (folder / f"{name}-selection.json").write_text(json.dumps({"configs": configs}))
    calibrated = planning.calibration(profile)
    assert calibrated == planning.Calibration(epochs=108 / 9, configs=3.0, selections=3)
    likely = {"epochs": calibrated.epochs, "configs": calibrated.configs}
    counts = TaskCounts(train_pairs=600, hyper_pairs=120, target_tokens=0, pair_tokens=90.0, test_inputs=200,
                        prompt_tokens=60.0)
    ref = grid.TaskRef("smollm2-135m-instruct", "e2e")
    selection = grid.Unit("selection", "s", ref, profile, method="Plugin")
    at_most = costs.work(selection, False, counts)["pair_epochs"]
    assert at_most == costs.grid_size(profile, "Plugin") * 40 * 720  # every configuration, every epoch
    assert costs.work(selection, False, counts, **likely)["pair_epochs"] == pytest.approx(3.0 * 108 / 9 * 720)
    seed_run = grid.Unit("run", "r", ref, profile, method="Plugin", seed=1)
    assert costs.work(seed_run, False, counts, **likely)["pair_epochs"] == pytest.approx(108 / 9 * 720)


def test_done_units_scale_the_likely_estimate_of_their_kind_to_their_stored_seconds(tmp_path, monkeypatch):
    from plugin_lib.harness.machine import results_dir

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    profile = load_profile("confirm")  # a coordinate search: a selection's record holds all its configurations
    ref = grid.TaskRef("smollm2-135m-instruct", "e2e")
    runs = [grid.Unit("run", f"runs/e2e/smollm2-135m-instruct/Plugin-seed{i}", ref, profile, method="Plugin", seed=i)
            for i in range(4)]
    selections = [grid.Unit("selection", f"s{i}", ref, profile, method="Plugin") for i in range(2)]
    plan = grid.Plan(runs + selections, state={u.key: "done" for u in runs[:3] + selections[:1]},
                     likely={u.key: 100.0 for u in runs + selections})
    folder = results_dir(profile) / "runs" / "e2e" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    for i, seconds in enumerate((10.0, 20.0, 30.0)):
        (folder / f"Plugin-seed{i}.json").write_text(json.dumps({"seconds": seconds}))
    stored = {u.key: s for u in runs[:3] if (s := planning.stored_seconds(u)) is not None}
    assert stored == {runs[0].key: 10.0, runs[1].key: 20.0, runs[2].key: 30.0}
    assert planning.stored_seconds(runs[3]) is None  # no record

    plan.stored = stored
    scales = planning.scale_to_stored(plan)
    assert scales == {"run": (pytest.approx(0.2), 3)}  # 60 s stored where 300 s were estimated
    assert plan.likely[runs[3].key] == pytest.approx(20.0)  # the pending run, scaled
    assert plan.likely[runs[0].key] == 100.0  # done units keep their estimate
    assert plan.likely[selections[1].key] == 100.0  # one done selection is too few to scale by
    printed = io.StringIO()
    print_plan(plan, profile, ["01"], show_units=False, out=printed)
    assert "Done: 4 units; the records of 3 of them (selection, run, bdpl) store 0.02 process-hours" in printed.getvalue()

    selection = folder / "Plugin-selection.json"
    selection.write_text(json.dumps({"configs": {"a": {"seconds": 5.0}, "b": {"seconds": 7.0}, "c": {}}}))
    unit = grid.Unit("selection", "runs/e2e/smollm2-135m-instruct/Plugin-selection", ref, profile, method="Plugin")
    assert planning.stored_seconds(unit) == 12.0  # its configurations' seconds, summed
    grid_profile = load_profile("local")  # a grid search: its configurations are config units of their own
    assert grid_profile.grid.search == "grid"
    assert planning.stored_seconds(grid.Unit("selection", unit.key, ref, grid_profile, method="Plugin")) is None


def test_a_selection_under_way_is_estimated_by_the_configurations_it_has_left(tmp_path, monkeypatch):
    real_data.require("e2e")  # the record's inputs fingerprint is E2E's
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    profile = load_profile("confirm")  # a coordinate search resumes from the configurations its record holds
    ref = grid.TaskRef("smollm2-135m-instruct", "e2e")
    unit = grid.Unit("selection", "runs/e2e/smollm2-135m-instruct/LoRA-selection", ref, profile, method="LoRA")
    assert planning.configs_stored(unit) == 0  # no record yet
    files = search.selection_files(grid.planning_task(ref, profile), "LoRA", profile, None, None)
    path, settings, inputs = files.folder / "LoRA-selection.json", files.settings, files.inputs
    path.parent.mkdir(parents=True)
    configs = {"a": {"seconds": 5.0}, "b": {"seconds": 7.0}}
    path.write_text(json.dumps({"settings": "other settings", "inputs": inputs, "configs": configs}))
    assert planning.configs_stored(unit) == 0  # left by other settings: the search will start afresh
    path.write_text(json.dumps({"settings": settings, "inputs": inputs, "configs": configs}))
    assert planning.configs_stored(unit) == 2
    assert planning.configs_stored(grid.Unit("selection", unit.key, ref, load_profile("local"), method="LoRA")) == 0

    counts = TaskCounts(train_pairs=600, hyper_pairs=120, target_tokens=0, pair_tokens=90.0, test_inputs=200,
                        prompt_tokens=60.0)
    likely = {"epochs": 10.0, "configs": 3.0}
    one = 10.0 * 720 * 90.0  # the LoRA tokens of one training at the calibrated epochs
    assert costs.work(unit, False, counts, **likely)["lora_tokens"] == pytest.approx(3 * one)
    assert costs.work(unit, False, counts, **likely, under_way=2)["lora_tokens"] == pytest.approx(one)
    # one more, at least
    assert costs.work(unit, False, counts, **likely, under_way=5)["lora_tokens"] == pytest.approx(one)
    most = costs.grid_size(profile, "LoRA")
    assert costs.work(unit, False, counts, under_way=2)["lora_tokens"] == pytest.approx((most - 2) * 40 * 720 * 90.0)


def test_a_missing_engine_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    plan = grid.Plan([_unit("a")], state={"a": "ready"})
    with pytest.raises(grid.MissingEngine, match=r"pip install 'plugin-repro\[ray\]'"):
        grid.run_ray(plan)
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(grid.MissingEngine, match=r"plugin-repro\[slurm\]"):
        grid.run_slurm(plan, grid.SlurmOptions(folder=Path("unused")))


def test_the_plan_command_prints_units_states_and_wall_times(tmp_path, monkeypatch, capsys):
    real_data.require("e2e")  # its units (or the workers it starts) read E2E
    from plugin_lib.commands.grid import main

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    assert main(["plan", "--profile", "smoke", "--only", "01", "--no-measure", "--csv", str(tmp_path / "u.csv")]) == 0
    out = capsys.readouterr().out
    assert "runs/e2e/smollm2-135m-instruct/Plugin-selection  selection  waiting" in out
    assert "All: 17 units; pending: 17. Not timed, so no hours" in out
    assert "device-hours" not in out and "Wall time" not in out  # no rates: no hours, not 0.00 of them
    assert len((tmp_path / "u.csv").read_text().splitlines()) == 1 + 17

    from plugin_lib.harness.planning import preflight_rates
    rates = {"smollm2-135m-instruct": preflight_rates.Rates(
        measured_with="a test's numbers", forward_tokens_per_s=1e4, train_pairs_per_s=50.0, decode_step_s=0.01,
        plugin_step_s=0.012, device="cpu", grid_train_pairs_per_s=150.0)}
    preflight_rates.save_rates(rates, tmp_path / "rates.json")
    assert main(["plan", "--profile", "smoke", "--only", "01", "--rates", str(tmp_path / "rates.json")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^All: 17 units, [\d,.]+ device-hours at most", out, re.M)
    assert "Wall time, one unit per GPU at a time: 1 GPU" in out and "32 GPUs" in out


def test_the_plans_run_keys_are_the_executions_for_every_base_of_paper_twin(tmp_path, monkeypatch):
    """A unit is done when its record is current under the keys the plan computes from the base's
    name alone (``planning_task``); the worker stores it under the keys of the loaded base. Both
    before and after the base has loaded in this process, they are one key."""
    real_data.require("e2e")
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    profile = load_profile("paper-twin")
    for model in profile.base_models:
        planned = grid.planning_task(grid.TaskRef(model, "e2e"), profile)
        before = {m: run_store.method_files(planned, profile, m) for m in ("Plugin", "Zeroshot")}
        loaded = runner.load_task(model, "e2e", profile)
        for method, files in before.items():
            for task in (loaded, planned):
                after = run_store.method_files(task, profile, method)
                assert (after.settings, after.inputs) == (files.settings, files.inputs), (model, method)


def test_fine_tuned_bases_and_bdpl_prompts_are_units_their_runs_need(tmp_path, monkeypatch):
    real_data.require("e2e")  # its units (or the workers it starts) read E2E
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    units = studies.units(load_profile("smoke"), ["05", "06", "10"])
    by_kind = {}
    for unit in units:
        by_kind.setdefault(unit.kind, []).append(unit)
    tunings = {u.key: u for u in by_kind["finetune"]}
    assert len(tunings) == 3  # 06: E2E at 1 epoch; 10: WebNLG and CommonGen
    assert all(callable(u.call) and u.done() is False for u in tunings.values())
    on_tuned = [u for u in units if u.task.checkpoint]
    assert on_tuned and all(set(u.needs) & set(tunings) for u in on_tuned)
    assert {u.task.prompt_model for u in on_tuned} == {"smollm2-135m-instruct"}
    (prompt,) = by_kind["bdpl"]  # one seed, no learning budgets in smoke
    assert prompt.key.endswith("bdpl-prompts/seed0") and prompt.done() is False
    assert not grid.is_done(prompt)


@pytest.mark.parametrize("name", ["paper", "colab", "local", "confirm", "wave3", "smoke", "paper-twin"])
def test_no_two_notebooks_write_one_record_two_ways_in_any_profile(name, tmp_path, monkeypatch):
    """Every notebook's units at once, as run_all.sh's grid plans them: a record that two notebooks
    share (E2E's Plugin-pretrained: notebooks 07 and 15) must be one unit, with one set of needs.
    paper-twin-gpu is paper-twin on the full-size twins (its stand-in alone is 4 GB to build)."""
    real_data.require("e2e", "webnlg", "commongen", "adidas")
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    profile = load_profile(name)
    problems = {}  # a notebook whose data this machine lacks (paper's 06, offline) is left out
    units = studies.units(profile, problems=problems)  # raises on two different units of one key
    assert len({u.key for u in units}) == len(units) and not set(problems) - {"06_fig2_base_quality"}
    if profile.proxy.pretrained:
        shared = [u for u in units if u.key.endswith("/Plugin-pretrained-seed0") and "/e2e/" in u.key
                  and profile.ablations.model in u.key]
        assert [set(u.notebooks) for u in shared] == [{"07_fig3_reweighting_complexity", "15_proxy_tuning"}]
