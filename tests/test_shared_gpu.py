"""Several trainings on one GPU (issue 72): the units that train from the stored caches run in
processes of their own, each holding the base's output layer alone, beside the process with the
whole base. The records and weights are bit for bit those of one unit at a time, on this CPU as
a GPU would run them (each process computes what it computes alone)."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

from plugin_lib.core.blackbox import OutputLayerBox, TopKBlackBox
from plugin_lib.harness import grid, models
from plugin_lib.harness.running import output_layers
from plugin_lib.harness.grid import units as grid_units

sys.path.insert(0, str(Path(__file__).parent))
import real_data  # noqa: E402
from grid_worker import mini_units, without_timing  # noqa: E402


def _digests(store: Path) -> dict[str, str | dict]:
    """Every record (timing fields removed) and every weights file (its SHA-256) of a store."""
    found = {}
    for path in sorted(store.rglob("*")):
        name = str(path.relative_to(store))
        if path.suffix == ".json" and ("-seed" in path.name or path.name.endswith("-selection.json")):
            found[name] = without_timing(json.loads(path.read_text()))
        elif path.suffix == ".pt":
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _run(store: Path, trainings: int, monkeypatch) -> list[dict]:
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(store))
    plan = grid.make_plan(mini_units(), measure=False)
    results = grid.run_local(plan, trainings=trainings, progress=False)
    assert not grid.failures(results), grid.failures(results)
    grid.refresh(plan)
    assert {k: v for k, v in plan.state.items() if v != "done"} == {}, results
    return results


def test_two_trainings_at_once_give_one_at_a_times_records_and_weights_bit_for_bit(tmp_path, monkeypatch):
    real_data.require("e2e")
    _run(tmp_path / "one", 1, monkeypatch)
    results = _run(tmp_path / "two", 2, monkeypatch)
    one, two = _digests(tmp_path / "one"), _digests(tmp_path / "two")
    assert any(k.endswith("Plugin-best.pt") for k in one) and any(k.endswith("Plugin-selection.json") for k in one)
    assert one == two  # exactly: no tolerance
    by_key = {r["key"].rsplit("/", 1)[-1]: r for r in results}
    trained = [k for k, u in ((u.key.rsplit("/", 1)[-1], u) for u in mini_units()) if grid_units.trains_from_cache(u)]
    assert trained and all(by_key[k]["base_loads"] == 0 and by_key[k]["head_loads"] == 1 for k in trained)
    assert {by_key[k]["pid"] for k in trained}.isdisjoint({by_key["cache"]["pid"]})  # a process of their own
    assert by_key["cache"]["base_loads"] == 1


def test_which_units_train_from_the_caches():
    kinds = {(u.kind, u.method): grid_units.trains_from_cache(u) for u in mini_units()}
    assert kinds[("config", "Plugin")] and kinds[("selection", "Plugin")]
    assert not kinds[("cache", None)] and not kinds[("run", "Plugin")] and not kinds[("run", "Zeroshot")]


def test_the_output_layer_alone_is_the_loaded_bases_own_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_CACHE_DIR", str(tmp_path))
    name = "llama-3.1-8b-twin-small"
    base = models.load_base_model(name, dtype="float32", device="cpu")
    box = output_layers.load(name, dtype="float32", device="cpu")  # not saved yet: loads the base once to save it
    assert isinstance(box, OutputLayerBox) and box.states_name == name
    head, alone = base.output_head(), box.output_head()
    assert torch.equal(head.weight, alone.weight) and (head.bias is None) == (alone.bias is None)
    assert (box.vocab_size, box.dtype, box.device.type) == (base.vocab_size, base.dtype, "cpu")
    hidden = torch.randn(5, head.width)
    assert torch.equal(head.log_probs(hidden), alone.log_probs(hidden))
    view = output_layers.load(f"{name}@top5", dtype="float32", device="cpu")
    whole_view = TopKBlackBox(base, 5, name=f"{name}@top5")
    assert view.states_name == name and view.name == whole_view.name
    assert torch.equal(view.output_head().log_probs(hidden), whole_view.output_head().log_probs(hidden))
    with pytest.raises(RuntimeError, match="output layer only"):
        box.logits(torch.ones(1, 3, dtype=torch.long))
    saved = list((tmp_path / output_layers.FOLDER).glob("*.safetensors"))
    assert len(saved) == 1 and not list(saved[0].parent.glob(".*.tmp"))
    assert output_layers.path(name, torch.float32, "cpu") == saved[0]
    assert output_layers.path(name, torch.float16, "cpu") != saved[0]  # keyed on the dtype


def test_an_api_base_has_no_output_layer_here():
    assert not output_layers.has_weights("smollm2-135m-instruct-api@top20")
    with pytest.raises(ValueError, match="behind an API"):
        output_layers.load("smollm2-135m-instruct-api@top20")


def test_a_worker_pool_holding_the_whole_base_trains_with_it():
    """The rule that keeps one unit at a time unchanged: the output layer alone only where the
    whole base is not held already."""
    pool = grid_units.BasePool()
    ref = grid_units.TaskRef("smollm2-135m-instruct", "e2e")
    profile = mini_units()[0].profile
    assert pool._held(ref, profile, True)  # noqa: SLF001 - the rule itself
    pool._bases[pool._key(ref, profile)] = object()  # noqa: SLF001 - as if loaded
    assert not pool._held(ref, profile, True)  # noqa: SLF001


def test_ray_with_two_trainings_per_gpu_gives_one_at_a_times_records(tmp_path, monkeypatch):
    """On a real Ray local cluster with one (declared) GPU: a unit that trains from the caches
    asks for half of it and holds the output layer alone where its worker has no base."""
    real_data.require("e2e")
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'plugin-repro[ray]')")
    _run(tmp_path / "one", 1, monkeypatch)
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "ray"))
    plan = grid.make_plan(mini_units(), measure=False)
    results = grid.run_ray(plan, num_cpus=2, num_gpus=1, trainings=2, progress=False)
    assert not grid.failures(results)
    assert _digests(tmp_path / "one") == _digests(tmp_path / "ray")


@pytest.mark.parametrize("family", ["llama", "gpt2-m"])  # GPT-2's reweighting model draws dropout
def test_the_concurrency_curve_requires_every_processs_weights_to_equal_the_lone_ones(family):
    """harness.planning.shared_rates, as --save-rates runs it on a GPU, here with a small shape on this
    CPU: the processes that trained at once end with the lone process's weights."""
    from plugin_lib.harness.planning.shared_rates import Shape, measure_shared

    shape = Shape(vocab=500, hidden=16, dtype="float32", arch=tuple(sorted(models.reweighter_spec(family).items())),
                  pairs=16, length=20, targets=6, batch_size=8, device="cpu")
    curve = measure_shared(shape, counts=(1, 2), steps=3)
    assert curve.digests_equal
    assert set(curve.pairs_per_s) == {"1", "2"} and all(rate > 0 for rate in curve.pairs_per_s.values())
    assert curve.host_ms > 0 and curve.device_ms is None and curve.peak_bytes is None  # a CPU has no device time


def test_processes_given_an_mps_environment_train_the_same_weights_and_leave_the_parents_as_it_was(tmp_path):
    """benchmarks/bench_mps.py's clients: started with an MPS daemon's folders in their environment
    (on this CPU they do not use it), they end with the lone process's weights, and the parent's
    environment is as before."""
    import os

    from plugin_lib.harness.planning.shared_rates import Shape, at_once

    shape = Shape(vocab=300, hidden=8, dtype="float32", arch=tuple(sorted(models.reweighter_spec("llama").items())),
                  pairs=8, length=12, targets=4, batch_size=4, device="cpu")
    alone = at_once(shape, 1, 2)
    served = at_once(shape, 2, 2, env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")})
    assert [r[0] for r in served] == [0, 1]
    assert {r[3] for r in served} == {alone[0][3]}
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_an_mps_daemon_that_does_not_start_is_refused_with_its_exit_status():
    """Where the control program fails (a container that forbids MPS, a driver without it), the
    benchmark is told why and measures the plain curve alone."""
    import shutil

    from plugin_lib.harness.planning.shared_rates import mps_server

    with pytest.raises(RuntimeError, match=r"the MPS daemon did not start \(exit 1\)"):
        with mps_server(shutil.which("false")):
            pass


@pytest.mark.slow
def test_the_mps_benchmark_on_a_cpu_measures_the_plain_curve_and_says_why_not_mps(tmp_path):
    """benchmarks/bench_mps.py --cpu, as gpu-check runs it on a CPU: the preflight's shape of the
    small LLaMA twin (its counts read E2E), 2 processes at once with the lone process's weights."""
    import os
    import subprocess

    real_data.require()
    out = tmp_path / "mps.json"
    done = subprocess.run([sys.executable, "benchmarks/bench_mps.py", "--cpu", "--models", "llama-3.1-8b",
                           "--out", str(out)], cwd=Path(__file__).resolve().parent.parent,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert (record["device"], record["mps_unavailable"]) == ("cpu", "a CPU")
    model = record["models"]["llama-3.1-8b-twin-small"]
    assert model["shape"]["vocab"] == 128256 and model["shape"]["dtype"] == "float32"
    row = model["counts"]["2"]
    assert row["digests_equal"] and row["plain_pairs_per_s"] > 0 and row["mps_pairs_per_s"] is None
    assert "MPS not measured (a CPU)" in done.stdout
