"""How many trainings share a GPU (harness.planning.concurrency) and how the plan prices them: a count
the user sets is kept; auto is 1 on a CPU, and on a GPU the least of what fits its memory beside
the unit with the whole base, the cores less one, and the measured curve's fastest count (12
at most before one is measured)."""
from __future__ import annotations

import dataclasses

import pytest

from plugin_lib.harness.planning import concurrency
from plugin_lib.harness.planning.preflight_rates import Rates
from plugin_lib.harness.profile import load_profile

GIB = 2**30


def _choose(**kw):
    settings = dict(setting="auto", gpu_bytes=141 * GIB, heavy_peak=38 * GIB, process_peak=6 * GIB, cores=16)
    return concurrency.choose(**{**settings, **kw})


def test_a_count_set_is_kept_and_a_cpu_trains_one_at_a_time():
    assert _choose(setting=3).trainings == 3
    cpu = _choose(gpu_bytes=None)
    assert cpu.trainings == 1 and "CPU" in cpu.why


def test_auto_is_the_least_of_memory_cores_and_the_cap():
    # 141 GiB less its 15% headroom (21.2) less 38 for the base leaves 81.8: 13 processes of 6 GiB.
    assert _choose().trainings == concurrency.AUTO_CAP == 12
    assert _choose(process_peak=12 * GIB).trainings == 6  # memory
    assert _choose(cores=5).trainings == 4  # one core for the unit with the whole base
    assert _choose(heavy_peak=200 * GIB).trainings == 1  # nothing fits beside it: one at a time still runs
    assert "until a concurrency curve is measured" in _choose().why


def test_a_measured_curve_picks_its_fastest_count_among_those_that_fit():
    curve = {"1": 100.0, "4": 380.0, "8": 700.0, "12": 690.0}
    assert _choose(curve=curve).trainings == 8
    assert _choose(curve=curve, process_peak=12 * GIB).trainings == 4  # 8 processes of 12 GiB do not fit
    assert concurrency.best_measured(curve, 3) == 1 and concurrency.best_measured(None, 12) is None


def test_the_curve_prices_a_searchs_configurations_and_nothing_else():
    rates = Rates("test", forward_tokens_per_s=1e4, train_pairs_per_s=100.0, decode_step_s=0.01, plugin_step_s=0.012,
                  device="cuda", shared_train_pairs_per_s={"1": 100.0, "8": 700.0})
    paper = load_profile("paper")
    work = {"grid_pair_epochs": 7000.0, "pair_epochs": 700.0}
    assert rates.for_profile(paper).seconds(work) == pytest.approx(70 + 7)  # one at a time
    assert rates.for_profile(paper, trainings=8).seconds(work) == pytest.approx(10 + 7)  # the searches shared
    assert rates.for_profile(paper, trainings=4).seconds(work) == pytest.approx(70 + 7)  # no count measured at 4 or below but 1
    older = dataclasses.replace(rates, shared_train_pairs_per_s=None)  # a file saved before the curve
    assert older.for_profile(paper, trainings=8).seconds(work) == pytest.approx(77)
    sharing = concurrency.Sharing(8, "8 at once")
    assert "priced 8 at once at 700 pairs/s together (x7.00 one alone" in concurrency.basis(rates, sharing)
    assert "one process at a time (no concurrency curve measured)" in concurrency.basis(older, sharing)


def test_lora_is_priced_as_the_run_trains_it():
    rates = Rates("test", forward_tokens_per_s=1e4, train_pairs_per_s=100.0, decode_step_s=0.01, plugin_step_s=0.012,
                  device="cuda", lora_tokens_per_s=300.0, lora_plain_tokens_per_s=400.0)
    paper = load_profile("paper")
    assert rates.for_profile(paper, lora_recompute=True).seconds({"lora_tokens": 1200.0}) == pytest.approx(4)
    assert rates.for_profile(paper, lora_recompute=False).seconds({"lora_tokens": 1200.0}) == pytest.approx(3)
    unmeasured = dataclasses.replace(rates, lora_tokens_per_s=None, lora_plain_tokens_per_s=None)
    assert unmeasured.for_profile(paper, lora_recompute=True).seconds({"lora_tokens": 1e4}) == pytest.approx(4)
    assert unmeasured.for_profile(paper, lora_recompute=False).seconds({"lora_tokens": 1e4}) == pytest.approx(3)
