"""Executors of a plan: ``local`` (this process), ``ray`` and ``slurm`` (through submitit).

All three call ``units.execute`` on each pending unit after the units it needs, and every unit
is a record in the run store, written atomically under its lock (``harness.running.runner``,
``utils.locks``): a unit that two executors reach at once is computed by one of them, and a
unit interrupted midway is redone by the next run. Local executors on one store pass over a unit
another is computing (``claims``) rather than wait on its lock. Locally and on Ray a unit that
fails does not stop the others: it and the units that need it come back with an ``error``
(:func:`failures`).

Several trainings share a GPU (``trainings`` above 1, ``harness.planning.concurrency``): the units that
only train from the stored caches (``units.trains_from_cache``) run that many at once, each in a
process of its own holding the base's output layer alone, beside the units that need the whole
base. Each process computes what it would compute alone, on the same shapes and seeds, so the
records are bit for bit those of one unit at a time (``tests/test_shared_gpu.py``).
Ray and submitit are optional (``pip install 'plugin-repro[ray]'`` / ``'plugin-repro[slurm]'``).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ...utils import malloc
from .claims import Claims
from .plan import Plan, gpu_share
from .units import Unit, execute, trains_from_cache

# What a worker elsewhere needs to find the data, the store and the models as this process does.
FORWARDED_ENV = ("PLUGIN_DATA_DIR", "PLUGIN_RESULTS_DIR", "PLUGIN_CACHE_DIR", "NLTK_DATA", "HF_HOME",
                 "HF_HUB_OFFLINE", "HF_TOKEN", "PYTHONPATH", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM")


class MissingEngine(RuntimeError):
    """An executor whose engine is not installed."""


def _engine(module: str, extra: str):
    try:
        return __import__(module)
    except ImportError as err:
        raise MissingEngine(f"The {extra} executor needs the '{module}' package, which is not installed here: "
                            f"pip install 'plugin-repro[{extra}]' (or pip install -r requirements.txt in this "
                            f"checkout), then run again.") from err


def forwarded_env() -> dict[str, str]:
    """The variables above, with one thread per worker and glibc's allocator set for tensors
    (``utils.malloc``: read at a worker's start, so they travel with it) unless set here."""
    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["GLIBC_TUNABLES"] = malloc.tunables()
    return env


@contextlib.contextmanager
def exit_on_sigterm():
    """Within it, SIGTERM (``kill``, Slurm's ``scancel``) raises SystemExit in the main thread,
    as Ctrl-C raises KeyboardInterrupt, so an executor's cleanup runs: Ray's local cluster is
    shut down, not left computing without its driver. (Ray's driver would otherwise abort on
    SIGTERM; within ``ray.wait`` the exit status becomes 1.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------- local


def _failed(key: str, error: BaseException | str) -> dict:
    if isinstance(error, BaseException):
        lines = str(error).strip().splitlines()  # Ray's text ends with the worker's exception
        error = lines[-1] if lines and type(error).__module__.startswith("ray") else f"{type(error).__name__}: {error}"
    return {"key": key, "error": error}


def _not_run(need: str) -> str:
    return f"not run: it needs {need}, which failed"


def _mark_unrun(results: list[dict], units: Sequence[Unit]) -> list[dict]:
    """A unit whose error comes from a unit it needs (Ray raises the need's error in it) is
    marked as not run, naming that unit."""
    needs = {u.key: u.needs for u in units}
    failed = {r["key"] for r in results if "error" in r}
    for result in results:
        lost = [k for k in needs.get(result["key"], ()) if k in failed]
        if "error" in result and lost:
            result["error"] = _not_run(lost[0])
    return results


def failures(results: Sequence[dict]) -> list[dict]:
    """The results of units that failed or were not run, each with its ``error``."""
    return [r for r in results if "error" in r]


def run_local(plan: Plan, *, trainings: int = 1, progress: bool = True, poll_s: float = 5.0) -> list[dict]:
    """Every pending unit in dependency order: in this process, one at a time, or with
    ``trainings`` above 1, that many units that train from the caches at once beside the others
    (:func:`_run_shared`). A unit that fails prints its traceback and the others go on, except
    those that need it. A unit that another ``grid run`` on this store is computing (its claim,
    ``grid.claims``) is passed over until that one is done; with nothing else to do, this one
    looks again every ``poll_s``."""
    if trainings > 1:
        return _run_shared(plan, trainings, progress, poll_s)
    pending = plan.pending()
    keys = {u.key for u in pending}
    waiting, done, failed, claims = list(pending), set(), set(), Claims()
    results: list[dict] = []
    bar = tqdm(total=len(pending), desc="grid (local)", disable=not progress)

    def lost(unit: Unit, result: dict) -> None:
        failed.add(unit.key)
        results.append(result)

    try:
        while waiting:
            unit = next(_startable(waiting, keys, done, failed, claims, lost), None)
            if unit is None:
                if waiting and claims.elsewhere:
                    bar.set_postfix_str(claims.waiting_note())
                    time.sleep(poll_s)
                    continue
                results.extend(_failed(u.key, "not run: its needs never finished") for u in waiting)
                break
            bar.set_postfix_str(unit.key)  # a log shows which unit the hours go to, not just how many are done
            try:
                results.append(execute(unit))
                done.add(unit.key)
            except Exception as err:  # noqa: BLE001 - reported with the unit's key; the rest go on
                traceback.print_exc()
                failed.add(unit.key)
                results.append(_failed(unit.key, err))
            finally:
                claims.release(unit)
            bar.update(len(results) - bar.n)  # units not run for a failed need count as well
    finally:
        bar.close()
        claims.release_all()
    return results


def _startable(waiting: list[Unit], keys: set[str], done: set[str], failed: set[str], claims: Claims,
               lost: Callable[[Unit, dict], None], fits: Callable[[Unit], bool] = lambda unit: True):
    """The waiting units that can start now, each taken off ``waiting`` as it is yielded: their
    needs are done, ``fits`` lets them (a free slot) and this process could claim them. A unit
    whose need failed is taken off too and handed to ``lost`` with its not-run result."""
    claims.elsewhere.clear()
    for unit in list(waiting):
        failed_needs = [k for k in unit.needs if k in failed]
        if failed_needs:
            waiting.remove(unit)
            lost(unit, _failed(unit.key, _not_run(failed_needs[0])))
        elif fits(unit) and all(k in done for k in unit.needs if k in keys) and claims.take(unit):
            waiting.remove(unit)
            yield unit


def _start_worker(threads: int) -> None:
    """A worker process of :func:`_run_shared`: the parent's torch threads, so that a training
    computes as it would in the parent (a CPU's reductions depend on the thread count)."""
    import torch

    torch.set_num_threads(threads)


def _pool(workers: int) -> ProcessPoolExecutor:
    import torch

    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
                               initargs=(torch.get_num_threads(),))


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop ``pool`` now: queued units dropped, running ones ended (their records are written
    atomically, so the next run redoes them)."""
    pool.shutdown(wait=False, cancel_futures=True)
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


def _run_shared(plan: Plan, trainings: int, progress: bool, poll_s: float) -> list[dict]:
    """``trainings`` units that train from the caches at once, each in a worker process holding
    the base's output layer alone (``units.execute(head_only=True)``), beside one worker that
    computes the others one at a time with the whole base (caches, runs, LoRA, fine-tuning, BDPL).
    This process holds the claims of the units its workers compute."""
    pending = plan.pending()
    keys = {u.key for u in pending}
    waiting, running, claims = list(pending), {}, Claims()
    done: set[str] = set()
    failed: set[str] = set()
    results: list[dict] = []
    lanes = {True: _pool(trainings), False: _pool(1)}
    slots = {True: trainings, False: 1}
    bar = tqdm(total=len(pending), desc=f"grid (local, {trainings} trainings at once)", disable=not progress)

    def finish(unit: Unit, result: dict) -> None:
        claims.release(unit)
        (failed if "error" in result else done).add(unit.key)
        results.append(result)
        bar.update(1)

    def free_slot(unit: Unit) -> bool:  # a slot of its lane: trainings from the caches, or the whole base's one
        light = trains_from_cache(unit)
        return sum(trains_from_cache(u) == light for u in running.values()) < slots[light]

    try:
        while waiting or running:
            for unit in _startable(waiting, keys, done, failed, claims, finish, fits=free_slot):
                light = trains_from_cache(unit)
                try:
                    running[lanes[light].submit(execute, unit, head_only=light)] = unit
                except Exception as err:  # noqa: BLE001 - a broken pool (a worker killed): the unit is reported
                    finish(unit, _failed(unit.key, err))
            if not running and waiting and claims.elsewhere:  # the rest are another process's, for now
                bar.set_postfix_str(claims.waiting_note())
                time.sleep(poll_s)
                continue
            if not running:  # nothing can start (a need outside the plan's order): say so, do not spin
                for unit in waiting:
                    finish(unit, _failed(unit.key, "not run: its needs never finished"))
                waiting = []
                continue
            finished, _ = wait_for(list(running), timeout=2.0, return_when=FIRST_COMPLETED)
            for future in finished:
                unit = running.pop(future)
                try:
                    finish(unit, future.result())
                except Exception as err:  # noqa: BLE001 - reported with the unit's key; the rest go on
                    cause = getattr(err, "__cause__", None)  # the worker's traceback, as text
                    print(f"[grid] {unit.key} failed:\n{cause or traceback.format_exc()}", file=sys.stderr)
                    finish(unit, _failed(unit.key, err))
                bar.set_postfix_str(f"last done: {unit.key}", refresh=False)
    finally:
        bar.close()
        for lane in lanes.values():
            _stop(lane) if waiting or running else lane.shutdown(wait=True)
        claims.release_all()
    return results


# ---------------------------------------------------------------- ray


def _ray_execute(unit: Unit, head_only: bool, *_needs) -> dict:
    """A Ray task: ``_needs`` are the results of the units it needs (Ray starts it after them)."""
    import ray

    return {**execute(unit, head_only=head_only), "gpu_ids": [str(i) for i in ray.get_gpu_ids()]}


def run_ray(plan: Plan, *, address: str | None = None, gpu_memory_gb: float = 80.0, num_gpus: float | None = None,
            num_cpus: int | None = None, trainings: int = 1, progress: bool = True) -> list[dict]:
    """Each pending unit as a Ray task asking for the share of a GPU its memory needs
    (``plan.gpu_share``), or, with ``trainings`` above 1, a unit that trains from the caches for
    1/``trainings`` of one, holding the base's output layer alone where its worker does not hold
    the base (``units.execute(head_only=True)``); the units it needs are passed as object
    references, so Ray starts it after them. Workers are kept between tasks (``max_calls=0``) and hold their last base
    (``units.BasePool``), and tasks are submitted base by base, so consecutive units on a worker
    share a loaded base.

    ``address``: a running cluster ("auto", "ray://host:10001"); without it a local cluster starts
    here, with ``num_gpus``/``num_cpus`` declared when given (otherwise detected)."""
    ray = _engine("ray", "ray")
    started_here = not ray.is_initialized()
    if started_here:
        options = {"runtime_env": {"env_vars": forwarded_env()}, "log_to_driver": False}
        if address:
            options["address"] = address
        else:
            options.update({k: v for k, v in (("num_gpus", num_gpus), ("num_cpus", num_cpus)) if v is not None})
        ray.init(**options)
    try:
        with exit_on_sigterm():  # after ray.init, whose own SIGTERM handler aborts the driver
            task = ray.remote(max_calls=0, max_retries=3)(_ray_execute)
            refs: dict[str, object] = {}
            gpu_bytes = int(gpu_memory_gb * 2**30)
            has_gpus = ray.cluster_resources().get("GPU", 0) > 0
            for unit in _by_base(plan.pending()):
                needs = [refs[k] for k in unit.needs if k in refs]
                light = trainings > 1 and trains_from_cache(unit)
                share = (1 / trainings if light else gpu_share(plan.gpu_bytes.get(unit.key, 0), gpu_bytes)) \
                    if has_gpus else 0
                refs[unit.key] = task.options(num_gpus=share, num_cpus=1, name=unit.key).remote(unit, light, *needs)
            keys = {ref: key for key, ref in refs.items()}
            results, remaining = [], list(refs.values())
            with tqdm(total=len(remaining), desc="grid (ray)", disable=not progress) as bar:
                while remaining:
                    # with a timeout, so that Ctrl-C (SIGINT) reaches this loop instead of waiting on a unit
                    done, remaining = ray.wait(remaining, num_returns=1, timeout=2.0)
                    for ref in done:
                        try:
                            results.append(ray.get(ref))
                        except ray.exceptions.RayError as err:  # the unit's, or one it needs
                            results.append(_failed(keys[ref], err))
                    if done:
                        bar.set_postfix_str(f"last done: {keys[done[-1]]}", refresh=False)
                        bar.update(len(done))
            return _mark_unrun(results, plan.units)
    finally:
        if started_here:
            ray.shutdown()


def _depths(units: Sequence[Unit]) -> dict[str, int]:
    """Each unit's dependency depth among ``units`` (in dependency order): 0 needs none of them."""
    depth: dict[str, int] = {}
    for unit in units:
        depth[unit.key] = 1 + max((depth[k] for k in unit.needs if k in depth), default=-1)
    return depth


def _by_base(units: Sequence[Unit]) -> list[Unit]:
    """``units`` in dependency order, grouped by base where the order allows: a stable sort by
    (dependency depth, base)."""
    depth = _depths(units)
    return sorted(units, key=lambda u: (depth[u.key], u.model))


# ---------------------------------------------------------------- slurm


@dataclass(frozen=True)
class SlurmOptions:
    """Where and how the jobs run: ``partition``, ``account``, ``time_min`` per job,
    ``gpus_per_job``, ``cpus_per_job``, ``mem_gb``; ``units_per_job`` units of one base per
    array task (one base load for all of them); ``folder``: submitit's logs and pickles."""

    folder: Path
    partition: str | None = None
    account: str | None = None
    time_min: int = 240
    gpus_per_job: int = 1
    cpus_per_job: int = 1
    mem_gb: float | None = None
    units_per_job: int = 8


def _checkpointable():
    submitit = _engine("submitit", "slurm")

    class UnitBatch(submitit.helpers.Checkpointable):
        """An array task: units of one base, one after the other. Preempted or timed out, it is
        requeued with the same units (``checkpoint``, submitit's default); the finished ones are
        then skipped, being stored."""

        def __call__(self, batch: list[Unit]) -> list[dict]:
            return [execute(unit) for unit in batch]

    return submitit, UnitBatch


def stages(units: Sequence[Unit]) -> list[list[Unit]]:
    """Pending units by dependency depth: stage k needs only stages before it."""
    depth = _depths(units)
    grouped: dict[int, list[Unit]] = defaultdict(list)
    for unit in units:
        grouped[depth[unit.key]].append(unit)
    return [grouped[k] for k in sorted(grouped)]


def batches(stage: Sequence[Unit], size: int) -> list[list[Unit]]:
    """A stage's units in batches of one base, ``size`` at most."""
    per_base: dict[str, list[Unit]] = defaultdict(list)
    for unit in stage:
        per_base[unit.model].append(unit)
    return [units[i:i + size] for units in per_base.values() for i in range(0, len(units), size)]


def run_slurm(plan: Plan, options: SlurmOptions, *, progress: bool = True, poll_s: float = 5.0) -> list[dict]:
    """The pending units as Slurm job arrays, one array per stage (:func:`stages`), each array
    after the previous one (``afterok``), each task a batch of units of one base. Waits for the
    last stage; a failed task cancels what remains and raises with its log's path."""
    submitit, UnitBatch = _checkpointable()
    executor = submitit.AutoExecutor(folder=str(options.folder), cluster="slurm")
    parameters = {"timeout_min": options.time_min, "cpus_per_task": options.cpus_per_job, "nodes": 1,
                  "tasks_per_node": 1, "slurm_job_name": "plugin-grid", "slurm_signal_delay_s": 120}
    if options.partition:
        parameters["slurm_partition"] = options.partition
    if options.account:
        parameters["slurm_account"] = options.account
    if options.gpus_per_job:
        parameters["gpus_per_node"] = options.gpus_per_job
    if options.mem_gb:
        parameters["mem_gb"] = options.mem_gb
    executor.update_parameters(**parameters)
    setup = [f"export {k}={_quote(v)}" for k, v in forwarded_env().items()]
    executor.update_parameters(slurm_setup=setup)

    jobs, previous = [], None
    for stage in stages(plan.pending()):
        if previous:
            executor.update_parameters(slurm_dependency=f"afterok:{previous}")
        stage_jobs = executor.map_array(UnitBatch(), batches(stage, options.units_per_job))
        jobs.append(stage_jobs)
        previous = stage_jobs[0].job_id.split("_")[0]
        print(f"[grid] slurm: stage {len(jobs)}: {len(stage)} units in array job {previous} "
              f"({len(stage_jobs)} tasks)", file=sys.stderr)
    results = []
    total = sum(len(s) for s in jobs)
    with tqdm(total=total, desc="grid (slurm)", disable=not progress) as bar:
        for index, stage_jobs in enumerate(jobs):
            for job in stage_jobs:
                while not job.done():
                    time.sleep(poll_s)
                try:
                    results += job.result()
                except Exception as err:
                    for later in jobs[index:]:
                        for other in later:
                            if not other.done():
                                other.cancel(check=False)
                    raise RuntimeError(f"Slurm job {job.job_id} failed ({type(err).__name__}); its log: "
                                       f"{job.paths.stderr}. Finished units are stored: run again to resume.") from err
                bar.update(1)
    return results


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"
