"""The grid's execution (harness.grid; its units and plan: tests/test_grid_plan.py): in this
process, on a real Ray local cluster (GPU resources declared, so the GPU scheduling path runs),
and on a real single-node Slurm through submitit (scripts/slurm_local.sh; skipped, with the
reason, where it cannot run). The records equal a serial run's apart from timing fields. Faults:
two executors at once on one store compute each unit once; a worker killed (SIGKILL) in the
middle of a unit loses nothing, and the rerun redoes that unit alone."""
from __future__ import annotations

import functools
import json
import operator
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plugin_lib.harness import grid
from plugin_lib.harness.grid import claims, executors
from plugin_lib.commands import grid as grid_command
from plugin_lib.harness.profile import load_profile
from plugin_lib.utils import malloc

sys.path.insert(0, str(Path(__file__).parent))
import real_data  # noqa: E402
from grid_worker import METHODS, mini_units, without_timing  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).parent / "grid_worker.py"


def _store(path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(path))
    return path


def _records(store: Path) -> dict[str, dict]:
    """Every run and selection record of the store, timing fields removed."""
    found = {str(p.relative_to(store)): without_timing(json.loads(p.read_text())) for p in store.rglob("*.json")
             if p.name.endswith(("-selection.json",)) or "-seed" in p.name}
    assert found
    return found


def _close(a, b, where=""):
    """Equal records, floats to 1e-9 relative (a loss summed in another order)."""
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _close(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def serial_store(tmp_path_factory):
    """The mini grid run one unit after another in this process: the reference records."""
    real_data.require("e2e")
    store = tmp_path_factory.mktemp("serial")
    saved = os.environ.get("PLUGIN_RESULTS_DIR")
    os.environ["PLUGIN_RESULTS_DIR"] = str(store)
    try:
        plan = grid.make_plan(mini_units(), measure=False)
        assert {plan.state[u.key] for u in plan.units} == {"ready", "waiting"}
        grid.run_local(plan, progress=False)
        grid.refresh(plan)
        assert set(plan.state.values()) == {"done"}  # resumes: a second run has nothing to do
    finally:
        if saved is None:
            os.environ.pop("PLUGIN_RESULTS_DIR", None)
        else:
            os.environ["PLUGIN_RESULTS_DIR"] = saved
    return store


# ---------------------------------------------------------------- real engines


def test_ray_local_cluster_gives_the_serial_records(serial_store, tmp_path, monkeypatch):
    real_data.require("e2e")  # its units (or the workers it starts) read E2E
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'plugin-repro[ray]')")
    store = _store(tmp_path / "ray", monkeypatch)
    plan = grid.make_plan(mini_units(), measure=False)
    results = grid.run_ray(plan, num_cpus=2, num_gpus=2, progress=False)
    assert sorted(r["key"] for r in results) == sorted(u.key for u in plan.units)
    assert all(r["gpu_ids"] for r in results)  # scheduled on (declared) GPUs, a share each
    assert {r["base_loads"] for r in results} == {1}  # each worker loaded the base once
    grid.refresh(plan)
    assert set(plan.state.values()) == {"done"}
    _close(_records(serial_store), _records(store))


def _called(key, call, needs=()):
    """A called unit (the kind notebooks 05, 06 and 10 supply) whose call is a picklable stdlib one."""
    return grid.Unit("finetune", key, grid.TaskRef("smollm2-135m-instruct", "e2e"), load_profile("smoke"),
                     needs=needs, call=call)


def _failing_plan() -> grid.Plan:
    units = [_called("fails", functools.partial(operator.truediv, 1, 0)),
             _called("needs-it", functools.partial(int, "1"), ("fails",)),
             _called("after-it", functools.partial(int, "1"), ("needs-it",)),
             _called("alone", functools.partial(int, "1"))]
    return grid.Plan(units, state={u.key: "ready" for u in units})


def _check_failures(results):
    errors = {r["key"]: r["error"] for r in grid.failures(results)}
    assert errors == {"fails": "ZeroDivisionError: division by zero",
                      "needs-it": "not run: it needs fails, which failed",
                      "after-it": "not run: it needs needs-it, which failed"}
    assert [r["key"] for r in results if "error" not in r] == ["alone"]  # the others went on


def test_a_failed_unit_stops_only_the_units_that_need_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))  # where the executor's claims go
    _check_failures(grid.run_local(_failing_plan(), progress=False))
    assert "ZeroDivisionError" in capsys.readouterr().err  # its traceback, for the log


def test_units_that_ran_without_an_error_yet_stay_pending_are_named_as_a_fault(capsys, tmp_path, monkeypatch):
    """A unit whose record is not current under the plan's keys once computed (the LLaMA twin's
    keys once moved when it loaded) fails the run with its own message, not "mend the failures
    above" with none above."""
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    never_done = grid.Unit("finetune", "stays-pending", grid.TaskRef("smollm2-135m-instruct", "e2e"),
                           load_profile("smoke"), call=functools.partial(int, "1"), done=lambda: False)
    plan = grid.Plan([never_done], state={"stays-pending": "ready"})
    args = grid_command.build_parser().parse_args(["run", "--profile", "smoke"])
    assert grid_command._run(plan, load_profile("smoke"), args) == 1
    err = capsys.readouterr().err
    assert "1 unit(s) ran without an error but their records are not current" in err and "stays-pending" in err
    assert "mend the failures" not in err


def test_the_local_progress_bar_names_the_unit_it_is_computing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    grid.run_local(_failing_plan())
    err = capsys.readouterr().err
    assert "grid (local)" in err and "alone" in err  # the last unit's key, beside the count


@pytest.mark.parametrize("trainings", [1, 2])
def test_a_unit_another_grid_process_computes_is_passed_over_until_it_is_done(trainings, tmp_path, monkeypatch):
    """Two `grid run` processes on one store: the one that meets a unit the other has claimed
    computes the units that do not need it first, then takes it once the other is done."""
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    units = [_called("theirs", functools.partial(int, "1")),
             _called("needs-theirs", functools.partial(int, "2"), ("theirs",)),
             _called("ours", functools.partial(int, "3"))]
    claim = claims.claim_lock(units[0]).path
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from plugin_lib.utils.locks import StoreLock; "
         "lock = StoreLock(sys.argv[1]); lock.acquire(); print('held', flush=True); time.sleep(4); lock.release()",
         str(claim)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert holder.stdout.readline().strip() == "held"
    plan = grid.Plan(units, state={u.key: "ready" for u in units})
    results = grid.run_local(plan, trainings=trainings, progress=False, poll_s=0.2)
    assert holder.wait(timeout=60) == 0
    # "theirs" came last but one: passed over while held, taken once the other process let go of it
    assert [r["key"] for r in results] == ["ours", "theirs", "needs-theirs"]
    assert not grid.failures(results) and not claim.exists()  # and this process let go of its claims


def test_a_failed_unit_on_ray_stops_only_the_units_that_need_it():
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'plugin-repro[ray]')")
    _check_failures(grid.run_ray(_failing_plan(), num_cpus=1, num_gpus=0, progress=False))


def test_ray_workers_start_with_the_forwarded_environment(tmp_path, monkeypatch):
    """Read when a process starts (glibc's tunables), so it must be in the worker's first environment."""
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'plugin-repro[ray]')")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    copy = _called("environ", functools.partial(shutil.copyfile, "/proc/self/environ", tmp_path / "environ"))
    assert not grid.failures(grid.run_ray(grid.Plan([copy], state={"environ": "ready"}), num_cpus=1, num_gpus=0,
                                          progress=False))
    started_with = dict(v.split("=", 1) for v in (tmp_path / "environ").read_text().split("\0") if "=" in v)
    # glibc rewrites the variable in place as it parses it, so the start shows only its first setting
    assert malloc.TUNABLES.startswith(started_with["GLIBC_TUNABLES"])
    assert started_with["OMP_NUM_THREADS"] == "1"


def _processes_named(title: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and title in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_sigterm_stops_a_ray_grid_and_its_workers():
    """kill (or Slurm's scancel) on the driver: the local cluster is shut down, its running unit
    with it, instead of computing on without a driver."""
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'plugin-repro[ray]')")
    title = f"ray::sigterm-unit-{os.getpid()}"
    script = (
        "import functools, time\n"
        "from plugin_lib.harness import grid\n"
        "from plugin_lib.harness.grid import executors\n"
        "from plugin_lib.harness.profile import load_profile\n"
        f"unit = grid.Unit('finetune', {title[5:]!r}, grid.TaskRef('smollm2-135m-instruct', 'e2e'), "
        "load_profile('smoke'), call=functools.partial(time.sleep, 300))\n"
        "with executors.exit_on_sigterm():\n"
        f"    grid.run_ray(grid.Plan([unit], state={{{title[5:]!r}: 'ready'}}), num_cpus=1, num_gpus=0, progress=False)\n")
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, start_new_session=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.time() + 120
        while not _processes_named(title):  # the unit runs on a worker
            assert driver.poll() is None and time.time() < deadline, "the unit never started"
            time.sleep(1)
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=60) > 0  # it exited (cleaning up), not killed by a signal (Ray's abort: -6)
        deadline = time.time() + 30
        while _processes_named(title) and time.time() < deadline:
            time.sleep(1)
        assert not _processes_named(title), "the worker outlived its driver"
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)


def _slurm_reason() -> str | None:
    if subprocess.run(["bash", str(ROOT / "scripts" / "slurm_local.sh"), "status"], capture_output=True).returncode:
        return ("no Slurm cluster answers here: start one with `sudo bash scripts/slurm_local.sh start` "
                "(Debian's slurmctld, slurmd and munge; .ci/run does this in CI)")
    return None


def test_slurm_cluster_gives_the_serial_records(serial_store, tmp_path, monkeypatch):
    real_data.require("e2e")  # its units (or the workers it starts) read E2E
    pytest.importorskip("submitit", reason="the slurm extra is not installed (pip install 'plugin-repro[slurm]')")
    reason = _slurm_reason()
    if reason and os.environ.get("PLUGIN_REQUIRE_SLURM") == "1":
        pytest.fail(reason)  # CI started one: it must answer
    if reason:
        pytest.skip(reason)
    store = _store(tmp_path / "slurm", monkeypatch)
    plan = grid.make_plan(mini_units(), measure=False)
    options = grid.SlurmOptions(folder=tmp_path / "submitit", gpus_per_job=0, time_min=30, units_per_job=8)
    results = grid.run_slurm(plan, options, progress=False, poll_s=1.0)
    assert sorted(r["key"] for r in results) == sorted(u.key for u in plan.units)
    logs = list((tmp_path / "submitit").glob("*_log.out"))
    assert logs  # written by the jobs on the cluster
    grid.refresh(plan)
    assert set(plan.state.values()) == {"done"}
    _close(_records(serial_store), _records(store))
    print(f"[slurm] the mini grid ran as {len(executors.stages(plan.units))} job arrays on the local cluster")


# ---------------------------------------------------------------- faults


def _lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def _worker(log: Path, store: Path, sleep_s: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "PLUGIN_RESULTS_DIR": str(store), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, str(WORKER), str(log), str(sleep_s)], env=env, start_new_session=True)


def test_two_executors_at_once_compute_each_unit_once(serial_store, tmp_path):
    real_data.require("e2e")  # its units (or the workers it starts) read E2E
    store, log = tmp_path / "store", tmp_path / "units.log"
    workers = [_worker(log, store), _worker(log, store)]
    assert [w.wait(timeout=600) for w in workers] == [0, 0]
    computed = [line[1] for line in _lines(log) if line[0] == "compute"]
    assert sorted(computed) == sorted(set(computed))  # nothing twice
    assert len(computed) == 2 + len(METHODS) + 1  # two caches (train, hyper), three runs, one configuration
    assert {line[-1] for line in _lines(log)} <= {str(w.pid) for w in workers}
    _close(_records(serial_store), _records(store))


@pytest.mark.parametrize("killed", ["after a second", "after the training saved its state"])
def test_a_worker_killed_mid_unit_loses_nothing_and_the_rerun_redoes_that_unit(serial_store, tmp_path, killed):
    real_data.require("e2e")  # its units (or the workers it starts) read E2E
    store, log = tmp_path / "store", tmp_path / "units.log"
    worker = _worker(log, store, sleep_s=120)
    deadline = time.time() + 300
    while not any(line[0] == "compute" and line[1].startswith("Plugin-lr") for line in _lines(log)):
        assert worker.poll() is None and time.time() < deadline, "the worker never reached the configuration"
        time.sleep(0.5)
    time.sleep(1.0)  # inside the unit: in its training, or in the sleep after it
    while killed != "after a second" and not list(store.rglob(".checkpoints/Plugin-lr*.pt")):  # the state the rerun resumes
        assert worker.poll() is None and time.time() < deadline, "the training never saved its state"
        time.sleep(0.5)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    before = {str(p.relative_to(store)): p.stat().st_mtime_ns for p in store.rglob("*") if p.is_file()
              and not p.name.endswith((".lock", ".tmp", ".partial", "RECORDS.sha256"))  # the manifest lists new ones
              and p.parent.name != ".checkpoints"}  # the killed training's state, if it saved one: resumed, then removed
    assert not any(name.endswith("Plugin-selection.json") for name in before)  # no partial record
    rerun = _worker(log, store)
    assert rerun.wait(timeout=600) == 0
    lines = _lines(log)
    computed = [line[1] for line in lines if line[0] == "compute"]
    ended = [line[1] for line in lines if line[0] == "end"]
    config = next(c for c in computed if c.startswith("Plugin-lr"))
    assert computed.count(config) == 2 and ended.count(config) == 1  # killed once, redone once
    assert all(computed.count(c) == 1 for c in computed if c != config)  # the finished units were kept
    after = {name: (store / name).stat().st_mtime_ns for name in before}
    assert after == before  # and not rewritten
    assert not list(store.rglob(".checkpoints/Plugin-lr*.pt"))  # the redone unit's state went once its result was stored
    _close(_records(serial_store), _records(store))
