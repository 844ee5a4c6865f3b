"""One cost model (issue 59): the preflight and ``grid plan`` price the same units of the study
registry (``commands.studies``) with ``harness.planning.costs``, so at the same rates they give the same
total hours, for every profile; and a run two notebooks share is counted once."""
from __future__ import annotations

import io
import re

import pytest

import real_data
from plugin_lib.commands import grid as grid_command
from plugin_lib.commands import preflight as preflight_command
from plugin_lib.commands import studies
from plugin_lib.harness.planning import costs, preflight, preflight_plan, preflight_rates
from plugin_lib.harness.grid import plan as planning
from plugin_lib.harness.profile import load_profile, profile_names


@pytest.fixture
def every_dataset(monkeypatch, tmp_path):
    real_data.require("e2e", "webnlg", "commongen", "adidas")
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "results"))  # nothing stored: every unit pending


def _rates_file(units, path, curve: bool = False) -> str:
    """Made-up rates, different per base, for every base the units run on; with ``curve``, a
    made-up concurrency curve measured on a made-up 141 GiB GPU with 16 cores."""
    bases = sorted({costs.shape_of(u) for u in units})
    shared = (lambda i: dict(shared_train_pairs_per_s={"1": 50.0 + i, "4": 170.0 + i, "8": 300.0 + i, "12": 290.0},
                             training_process_bytes=6 * 2**30, cores=16, gpu_memory_bytes=141 * 2**30)) if curve \
        else (lambda i: {})
    rates = {m: preflight_rates.Rates(measured_with=f"{m} (a test's numbers)", forward_tokens_per_s=1e4 + 100 * i,
                                      train_pairs_per_s=50.0 + i, decode_step_s=0.01 + 0.001 * i,
                                      plugin_step_s=0.012 + 0.001 * i, device="cuda",
                                      grid_train_pairs_per_s=150.0 + i, **shared(i))
             for i, m in enumerate(bases)}
    preflight_rates.save_rates(rates, path)
    return str(path)


@pytest.mark.parametrize("name", profile_names())
def test_the_preflight_and_the_grid_plan_price_the_same_units_alike(name, every_dataset, tmp_path):
    profile = load_profile(name)
    problems: dict[str, str] = {}
    units = studies.units(profile, problems=problems)
    assert units, name
    rates_file = _rates_file(units, tmp_path / "rates.json")
    grid_seconds = sum(planning.make_plan(units, measure=False, with_state=False, rates_file=rates_file).seconds.values())
    _, gpu = preflight.planning_gpu(profile)
    plans = preflight_plan.plan_notebooks(units, studies.notes(), gpu, problems)
    rates = preflight.base_rates(profile, sorted({w["model"] for p in plans for w in p.work}), rates_file=rates_file)
    rates, _ = preflight.priced_rates(profile, rates, plans, None)
    preflight_seconds = sum(preflight.plan_seconds(p, rates) for p in plans if p.work)
    assert grid_seconds > 0
    assert preflight_seconds == pytest.approx(grid_seconds, rel=1e-9)
    # Each unit counted once: under the first notebook that lists it.
    assert sum(len(p.work) for p in plans) == len(units)


@pytest.mark.parametrize("curve", [False, True], ids=["one at a time", "a concurrency curve"])
def test_both_commands_print_the_same_total_hours(curve, every_dataset, tmp_path, capsys):
    profile = load_profile("paper")
    rates_file = _rates_file(studies.units(profile, problems={}), tmp_path / "rates.json", curve)
    out = io.StringIO()
    preflight_command.run("paper", plan_only=True, rates_file=rates_file, out=out)
    preflight_total = re.search(r"^Total: ([\d,.]+) hours at most", out.getvalue(), re.M).group(1)
    assert grid_command.main(["plan", "--profile", "paper", "--summary", "--rates", rates_file]) == 0
    printed = capsys.readouterr().out
    grid_total = re.search(r"^All: \d+ units, ([\d,.]+) device-hours at most", printed, re.M).group(1)
    assert preflight_total == grid_total
    # The basis, in the same words in both: serially until a curve is measured; then 8 at once,
    # where the made-up curve is fastest among the counts that fit 141 GiB and 15 cores.
    said = "configurations priced 8 at once at 30" if curve else "trainings priced one process at a time (no concurrency"
    assert said in out.getvalue() and said in printed


def test_a_run_two_notebooks_share_is_priced_once(every_dataset):
    """Notebooks 07 and 15 share E2E's Plugin-pretrained runs; 01 and 15 share NewModel's search."""
    profile = load_profile("local")
    units = studies.units(profile, ["01", "07", "15"])
    shared = [u for u in units if len(u.notebooks) > 1]
    assert shared
    plans = {p.notebook: p for p in preflight_plan.plan_notebooks(units, studies.notes(["01", "07", "15"]), False)}
    assert sum(len(p.work) for p in plans.values()) == len(units)
    alone = preflight_plan.plan_notebooks(studies.units(profile, ["15"]), studies.notes(["15"]), False)[0]
    assert len(alone.work) > len(plans["15_proxy_tuning"].work)  # alone, 15 pays for what 01 and 07 ran
    # A notebook's row is the sum of the tallies of the units it owns, field by field.
    owned = [u for u in units if next(nb for nb in u.notebooks if nb in plans) == "07_fig3_reweighting_complexity"]
    total = sum((costs.tally(u, False) for u in owned), costs.Tally())
    assert total == plans["07_fig3_reweighting_complexity"].tally and total.trainings > 0 and total.disk_bytes > 0
