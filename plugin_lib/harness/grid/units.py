"""Units of the grid: what one worker computes and stores as one record.

A unit names a record of the run store and the call that makes it:

- ``cache``: the base-output caches (train and hyper-validation) of a (dataset, base);
- ``config``: one hyper-parameter configuration of a search (``search.train_config``);
- ``selection``: the search itself (``search.select_hparams``): with every configuration of the
  grid recorded it only pushes the edges, if the profile allows it, and settles the choice;
- ``run``: a seed run (``runner.run_experiment``);
- ``finetune`` and ``bdpl``: a fine-tuned base (notebooks 06, 10) and a BDPL prompt with the
  runs on its prefixed task (notebook 05), each a call its notebook's module supplies
  (``call``, with ``done`` saying whether its records are stored), since what they compute is
  the notebook's own (the harness never imports the notebooks' modules).

Units are built from the notebooks' own job lists (``runner.table_jobs``,
``harness.baselines.variants.variant_jobs``), so a unit's record is the one its notebook reads, keyed
by the same fingerprints; a unit whose record is current is done and is skipped.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...core.blackbox import OutputLayerBox, TopKBlackBox
from ...core.cache import BaseOutputCache
from ...utils import malloc
from ..baselines import finetune
from .. import methods, models, tasks
from ..running import output_layers, run_keys, run_store, runner, search
from ..running.output_layers import trains_from_cache
from ..profile import Profile

KINDS = ("cache", "config", "selection", "run", "finetune", "bdpl")
CALLED = ("finetune", "bdpl")


@dataclass(frozen=True)
class TaskRef:
    """A task as a worker rebuilds it: the base's registry name (a top-k view included), the
    dataset, and the model whose prompt format it uses (default: the base)."""

    model: str
    dataset: str
    prompt_model: str | None = None
    checkpoint: str | None = None  # a fine-tuned base's directory (``finetune.load_finetuned_base``)


@dataclass(frozen=True)
class Unit:
    """One record of the run store and the call that makes it (module docstring).

    ``key`` is the record's place in the store (``runs/<dataset>/<model>/<file stem>``), unique
    in a plan; ``needs``: keys of the units whose records it reads; ``narrow``: trained on the
    hyper-parameters chosen for the task's Plugin (``search.narrowed_profile``), so it needs
    that selection too."""

    kind: str
    key: str
    task: TaskRef
    profile: Profile = field(repr=False)
    method: str | None = None
    label: str | None = None
    seed: int | None = None
    arch: tuple = ()  # sorted (key, value) pairs; () is the family's reweighting model
    hparams: tuple = ()
    narrow: bool = False
    needs: tuple[str, ...] = ()
    notebooks: tuple[str, ...] = ()
    call: Callable[[], object] | None = field(default=None, repr=False, compare=False)
    done: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    work: tuple = ()  # a called unit's work for the plan's estimate (preflight.Rates.seconds' keys)

    @property
    def arch_dict(self) -> dict | None:
        return dict(self.arch) or None

    @property
    def model(self) -> str:
        return self.task.model


def _frozen(mapping: dict | None) -> tuple:
    return tuple(sorted((mapping or {}).items()))


def folder_key(ref: TaskRef) -> str:
    """The run-store folder of a task's records, relative to the profile's results."""
    return f"runs/{ref.dataset}/{ref.model.replace('/', '--')}"


def task_units(ref: TaskRef, profile: Profile, jobs: Iterable[tuple], notebook: str, needs: tuple[str, ...] = ()
               ) -> list[Unit]:
    """The units of runs on one task. ``jobs``: (method, seed, label, arch, narrow) tuples, e.g.
    from ``runner.table_jobs`` or ``variants.variant_jobs``. Every trained method's search is
    split into a unit per configuration of the profile's grid (``search: grid``; a coordinate
    search decides its next configuration from the last, so it stays one unit). ``needs``: units
    every unit of the task needs (the fine-tuning of its base)."""
    folder, task_needs = folder_key(ref), tuple(needs)
    cache = Unit("cache", f"{folder}/cache", ref, profile, needs=task_needs, notebooks=(notebook,))
    units = {cache.key: cache}
    selections: dict[tuple, Unit] = {}

    def selection(method: str, label: str, arch: dict | None) -> Unit:
        key = (label, _frozen(arch))
        if key not in selections:
            config_keys = []
            if profile.grid.search == "grid":
                for hparams in run_keys.hparam_grid(profile, method):
                    config = Unit("config", f"{folder}/{label}-{run_keys.config_tag(hparams)}", ref, profile, method=method,
                                  label=label, arch=_frozen(arch), hparams=_frozen(hparams), needs=(cache.key, *task_needs),
                                  notebooks=(notebook,))
                    units[config.key] = config
                    config_keys.append(config.key)
            unit = Unit("selection", f"{folder}/{label}-selection", ref, profile, method=method, label=label,
                        arch=_frozen(arch), needs=(cache.key, *config_keys, *task_needs), notebooks=(notebook,))
            units[unit.key] = selections[key] = unit
        return selections[key]

    trained = methods.TRAINED_METHODS + methods.EXTRA_METHODS
    for method, seed, label, arch, narrow in jobs:
        needs = list(task_needs)
        if method in trained:
            # A narrowed variant searches a grid of one configuration inside its run, once the
            # task's Plugin has chosen; the others train on their own search's choice.
            needs.append(selection("Plugin", "Plugin", None).key if narrow else selection(method, label, arch).key)
        elif method in methods.PROXY_ARMS:  # its expert is NewModel's (with the arm's suffix): that search's choice
            expert = methods.trained_as(method)
            needs.append(selection("Plugin", "Plugin", None).key if narrow
                         else selection(expert, expert + label.removeprefix(method), arch).key)
        if method == "TempNet-greedy":  # reads the stored Zeroshot run of the same seed
            needs.append(f"{folder}/Zeroshot-seed{seed}")
        unit = Unit("run", f"{folder}/{label}-seed{seed}", ref, profile, method=method, label=label, seed=seed,
                    arch=_frozen(arch), narrow=narrow, needs=tuple(dict.fromkeys(needs)),
                    notebooks=(notebook,))
        units[unit.key] = unit
    return list(units.values())


def table_units(dataset: str, profile: Profile, notebook: str, *, model_names: Sequence[str] | None = None,
                method_names: Sequence[str] | None = None) -> list[Unit]:
    """The units of ``runner.run_table`` (notebooks 01-04, 11, 12)."""
    runner.check_run_arguments(dataset, model_names=model_names, method_names=method_names)
    units = []
    for model, jobs in runner.table_jobs(profile, model_names, method_names).items():
        units += task_units(TaskRef(model, dataset), profile,
                            [(method, seed, method, None, False) for method, seed in jobs], notebook)
    return units


def merge(units: Iterable[Unit]) -> list[Unit]:
    """One unit per key, in first-seen order; a unit that several notebooks share lists them all.
    Two units with one key must be the same call."""
    merged: OrderedDict[str, Unit] = OrderedDict()
    for unit in units:
        seen = merged.get(unit.key)
        if seen is None:
            merged[unit.key] = unit
            continue
        fields = ("kind", "task", "profile", "method", "seed", "arch", "hparams", "narrow")
        if any(getattr(seen, f) != getattr(unit, f) for f in fields):
            raise ValueError(f"Two different units write {unit.key}: {seen} and {unit}.")
        notebooks = tuple(dict.fromkeys(seen.notebooks + unit.notebooks))
        needs = tuple(dict.fromkeys(seen.needs + unit.needs))
        merged[unit.key] = dataclasses.replace(seen, notebooks=notebooks, needs=needs)
    return list(merged.values())


# ---------------------------------------------------------------- state, without loading a base


class _NamedBase:
    """A base known by its name only: enough to make a task's splits and fingerprints (which
    read the name and the data, never the weights). Its tokenizer (``tokenizer_of``'s) loads on
    first use."""

    def __init__(self, name: str, tokenizer_of: str):
        self.name, self._tokenizer_of = name, tokenizer_of

    @property
    def states_name(self) -> str:
        """As ``BlackBoxLM.states_name``: a top-k view's outputs come from its base."""
        view = models.parse_model_name(self.name)
        return view[0] if view is not None else self.name

    @functools.cached_property
    def tokenizer(self):
        view = models.parse_model_name(self._tokenizer_of)
        return models.load_tokenizer(view[0] if view is not None else self._tokenizer_of)


@functools.lru_cache(maxsize=256)
def planning_task(ref: TaskRef, profile: Profile) -> tasks.Task:
    """The task of ``ref`` on a base known by its name: splits, prompts, fingerprints, no weights."""
    # A fine-tuned base keeps the tokenizer of the model it came from.
    named = _NamedBase(ref.model, ref.prompt_model if ref.checkpoint else ref.model)
    return runner.load_task(named, ref.dataset, profile, prompt_model=ref.prompt_model)


def finetune_unit(tuned: finetune.FinetunedBase, dataset: str, profile: Profile, notebook: str,
                  work: dict | None = None) -> Unit:
    """The unit that fine-tunes ``tuned`` (``finetune.prepare``), keyed by its name."""
    return Unit("finetune", tuned.name, TaskRef(tuned.model_name, dataset), profile, notebooks=(notebook,),
                call=functools.partial(finetune.prepare, tuned), done=functools.partial(finetune.is_prepared, tuned),
                work=_frozen(work))


def finetuned_ref(tuned: finetune.FinetunedBase, dataset: str) -> TaskRef:
    """A task on the fine-tuned base, in the prompt format of the model it came from."""
    return TaskRef(tuned.name, dataset, prompt_model=tuned.model_name, checkpoint=str(tuned.path))


def stored_selection(unit: Unit) -> dict | None:
    """The current record (settings and inputs fingerprints checked) of a config or selection
    unit's search, complete or not; None if there is none or it was left by other settings."""
    task = planning_task(unit.task, unit.profile)
    return search.stored_selection(task, unit.method, unit.profile, arch=unit.arch_dict, label=unit.label)


def is_done(unit: Unit) -> bool:
    """Whether the unit's record is stored and current (the call would compute nothing)."""
    if unit.kind in CALLED:
        return bool(unit.done())
    task = planning_task(unit.task, unit.profile)
    if unit.kind == "run":
        if unit.narrow:
            profile = _narrowed_if_chosen(task, unit.profile)
            if profile is None:
                return False
        else:
            profile = unit.profile
        return runner.stored_run(task, unit.method, unit.seed, profile, arch=unit.arch_dict,
                                 label=unit.label) is not None
    if unit.kind in ("config", "selection"):
        record = stored_selection(unit)
        if record is None:
            return False
        if unit.kind == "config":
            return run_keys.config_tag(dict(unit.hparams)) in record["configs"]
        return "grid" in record and record.get("best") is not None
    if unit.kind == "cache":
        try:
            # The store's folder now (the planning task is shared across stores; runner.load_task's place).
            folder = run_store.runs_dir(unit.profile, task.dataset, task.base.states_name) / "cache"
            return all(BaseOutputCache.is_stored(folder, task.base, task.encoded(split)) for split in ("train", "hyper"))
        except (OSError, ValueError):  # no tokenizer offline (a Hub base): the cache cannot be found here
            return False
    raise ValueError(f"Unknown unit kind {unit.kind!r}; one of {KINDS}.")


def _narrowed_if_chosen(task: tasks.Task, profile: Profile) -> Profile | None:
    """The narrowed profile from the stored Plugin search, or None while that search is unfinished."""
    record = search.stored_selection(task, "Plugin", profile)
    if record is None or "grid" not in record:
        return None
    return search.narrowed_to(profile, record)


# ---------------------------------------------------------------- execution, in a worker


class BasePool:
    """The bases a worker holds, most recently used last: the next unit on the same base (or a
    top-k view of it) reuses the loaded weights. ``size`` bases at most (one by default: a GPU
    holds one 8B base at a time). A unit that trains from the caches is given the base's output
    layer alone (``head_only``) unless the whole base is held already; a whole base loaded here
    saves its output layer for them (``output_layers``)."""

    def __init__(self, size: int = 1):
        self.size = size
        self._bases: OrderedDict[tuple, object] = OrderedDict()
        self._tasks: OrderedDict[tuple, tasks.Task] = OrderedDict()
        self.loads = 0  # whole bases loaded
        self.head_loads = 0  # output layers alone

    @staticmethod
    def _key(ref: TaskRef, profile: Profile, head_only: bool = False) -> tuple[str, str, bool]:
        """The loaded weights a task runs on: a top-k view shares its base's."""
        view = models.parse_model_name(ref.model)
        return (view[0] if view is not None else ref.model, str(profile.dtype), head_only)

    def _held(self, ref: TaskRef, profile: Profile, head_only: bool) -> bool:
        """The weights to use: the output layer alone only where the whole base is not held."""
        return head_only and self._key(ref, profile) not in self._bases

    def base(self, ref: TaskRef, profile: Profile, head_only: bool = False):
        head_only = self._held(ref, profile, head_only)
        view = models.parse_model_name(ref.model)
        key = self._key(ref, profile, head_only)
        root = key[0]
        if key not in self._bases:
            while len(self._bases) >= self.size:
                old, _ = self._bases.popitem(last=False)
                for task_key in [k for k in self._tasks if k[0] == old]:
                    del self._tasks[task_key]
            if head_only:
                self._bases[key] = output_layers.load(root, dtype=profile.dtype)
                self.head_loads += 1
            elif ref.checkpoint is not None:
                self._bases[key] = finetune.load_finetuned_base(Path(ref.checkpoint), profile.dtype)
                self.loads += 1
            else:
                self._bases[key] = models.load_base_model(root, dtype=profile.dtype)
                if output_layers.has_weights(root):
                    output_layers.save(self._bases[key])
                self.loads += 1
        self._bases.move_to_end(key)
        base = self._bases[key]
        if view is None:
            return base
        _, k, rule = view
        if head_only:
            return OutputLayerBox.top_k_view(base, k, rule, name=ref.model)
        return TopKBlackBox(base, k, rule, name=ref.model)

    def task(self, ref: TaskRef, profile: Profile, head_only: bool = False) -> tasks.Task:
        """The task, with its encoded pairs and caches kept for the next unit on it (in the run
        store of now: a process that moves to another store, PLUGIN_RESULTS_DIR, builds it anew)."""
        head_only = self._held(ref, profile, head_only)
        key = (self._key(ref, profile, head_only), ref, profile, str(run_store.runs_dir(profile, ref.dataset, ref.model)))
        if key not in self._tasks:
            self._tasks[key] = runner.load_task(self.base(ref, profile, head_only), ref.dataset, profile,
                                                prompt_model=ref.prompt_model)
        self.base(ref, profile, head_only)  # most recently used
        return self._tasks[key]


_POOL = BasePool()


def release_pool() -> None:
    """Drop the bases this process's pool holds (the orchestrator, once its grid is done)."""
    global _POOL
    _POOL = BasePool(_POOL.size)


def worker_task(ref: TaskRef, profile: Profile) -> tasks.Task:
    """The task in this worker's pool (a called unit's way to reuse the loaded base)."""
    return _POOL.task(ref, profile)


def execute(unit: Unit, pool: BasePool | None = None, *, head_only: bool = False) -> dict:
    """Compute the unit (nothing, if its record is current) in this process; a short summary.
    ``head_only``: a unit that trains from the caches (:func:`trains_from_cache`) loads the base's
    output layer alone where the whole base is not held. A worker runs many units: the free heap
    goes back to the kernel after each (``malloc.release``)."""
    try:
        return _execute(unit, pool or _POOL, head_only and trains_from_cache(unit))
    finally:
        malloc.release()


def _execute(unit: Unit, pool: BasePool, head_only: bool) -> dict:
    started = time.perf_counter()
    if unit.kind in CALLED:
        unit.call()
        return {"key": unit.key, "seconds": time.perf_counter() - started, "host": socket.gethostname(),
                "pid": os.getpid(), "base_loads": pool.loads}
    task = pool.task(unit.task, unit.profile, head_only)
    if unit.kind == "cache":
        for split in ("train", "hyper"):
            task.base_cache(split)
    elif unit.kind == "config":
        search.train_config(task, unit.method, unit.profile, dict(unit.hparams), arch=unit.arch_dict,
                            label=unit.label)
    elif unit.kind == "selection":
        search.select_hparams(task, unit.method, unit.profile, arch=unit.arch_dict, label=unit.label,
                              progress=False)
    elif unit.kind == "run":
        profile = search.narrowed_profile(task, unit.profile, "Plugin") if unit.narrow else unit.profile
        runner.run_experiment(task, unit.method, unit.seed, profile, arch=unit.arch_dict, label=unit.label,
                              progress=False)
    else:
        raise ValueError(f"Unknown unit kind {unit.kind!r}; one of {KINDS}.")
    return {"key": unit.key, "seconds": time.perf_counter() - started, "host": socket.gethostname(),
            "pid": os.getpid(), "base_loads": pool.loads, "head_loads": pool.head_loads}
