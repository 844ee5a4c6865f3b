"""Runs (dataset, base model, method, seed) experiments and stores each as one JSON file.

A run's file, ``results/<profile>/runs/<dataset>/<model>/<method>-seed<k>.json``, holds the
test predictions, the seven metrics, the chosen hyperparameters, the training history and the
scale it was produced at (and, for a model behind an API, the requests, tokens and seconds it
cost: ``api_usage``). Files are written atomically, and a run whose file exists is not
redone (unless ``force``), so an interrupted notebook resumes where it stopped. Each record's
hash goes into the store's manifest as it is written (``utils.record_manifest``).

A stored run counts only if it was made from the same inputs: its ``settings`` (a hash of the
profile's settings that shape it, :func:`settings_fingerprint`) and its ``inputs`` (a hash of
the task's data, :func:`inputs_fingerprint`: every train, hyper-validation and test example's
id, source and references, and the base model's spec) must both match the current ones.
Otherwise it is stale and is made again, never silently reused; a record without ``inputs``
is stale. The same holds for the grid-search records (``<label>-selection.json``).
Arguments are checked before anything is loaded or written (:func:`check_run_arguments`).

Hyperparameters are chosen on hyper-validation loss over the profile's grid with the first
seed; later seeds reuse the choice. The grid search itself resumes: every configuration's
loss is recorded as it finishes, together with the weights of the best one so far.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import hashlib
import shutil
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import data
from ..core.api import ApiBlackBox
from ..core.blackbox import BlackBoxLM
from ..metrics import compute_metrics
from ..utils.io import atomic_write_json, atomic_write_with, read_json, remove_stale_temporaries
from ..utils.provenance import provenance
from ..utils.record_manifest import note_written
from ..utils import malloc
from ..utils.locks import StoreLock
from . import methods, models
from . import profile as config
from .profile import Profile
from .run_keys import (beyond_edge, config_tag, grid_edges, grid_keys, hparam_grid, inputs_fingerprint, is_current,
                       settings_fingerprint)


def runs_dir(profile: Profile, dataset: str, model: str) -> Path:
    return config.results_dir(profile) / "runs" / dataset / model.replace("/", "--")


def arch_for(model: str) -> dict:
    return models.arch_for(model)


def _load_if_current(path: Path, fingerprint: str, inputs: str) -> dict | None:
    if not path.exists():
        return None
    record = read_json(path)
    return record if is_current(record, fingerprint, inputs) else None


def _write_record(path: Path, record: dict) -> None:
    """A record, then its hash into the store's manifest: an edit made later is caught."""
    atomic_write_json(path, record)
    note_written(path)


def unit_lock(folder: Path, name: str) -> StoreLock:
    """The lock of one unit of work in a run folder (``.locks/<name>.lock``): the process that
    holds it computes the unit; another waits, then finds the unit's record and reads it."""
    return StoreLock(folder / ".locks" / f"{name}.lock")


def fit_checkpoint(folder: Path, name: str, fingerprint: str, inputs: str) -> Path:
    """Where the training of unit ``name`` keeps its state (``core.train.fit``) until its result
    is stored, in ``<run folder>/.checkpoints/``: named after the unit (its hyperparameters among
    them) and the fingerprints of its settings and its data, so that no training of other
    settings or data resumes from it. The unit's checkpoints of other fingerprints untouched for
    an hour, and temporaries of killed writers, are removed."""
    kept = folder / ".checkpoints"
    remove_stale_temporaries(kept)
    key = hashlib.sha256(f"{fingerprint}:{inputs}".encode()).hexdigest()[:12]
    path = kept / f"{name}-{key}.pt"
    for other in kept.glob(f"{glob.escape(name)}-*.pt") if kept.is_dir() else ():
        if other != path and len(other.stem) == len(path.stem) and time.time() - other.stat().st_mtime > 3600:
            other.unlink(missing_ok=True)
    return path


def _save_state(model: torch.nn.Module, path: Path) -> None:
    """The model's weights at ``path``, atomically (``atomic_write_with``)."""
    try:
        atomic_write_with(path, lambda f: torch.save(model.state_dict(), f))
    except BaseException as err:
        needed = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        free = shutil.disk_usage(path.parent).free
        if isinstance(err, (OSError, RuntimeError)) and free < 2 * needed:
            # torch.save reports a full disk as "unexpected pos ...": say what it is and what to do.
            raise OSError(errno.ENOSPC, f"the disk under {path.parent} is full ({free / 2**20:,.0f} MiB free; "
                          f"these weights need {needed / 2**20:,.0f} MiB), so {path.name} was not written and no "
                          "stored result was replaced. Free disk space, or point PLUGIN_RESULTS_DIR at a larger "
                          "disk, and run again: finished runs are kept.") from err
        raise


@contextlib.contextmanager
def _nothing_left_on_full_disk(checkpoint):
    """A unit that fails on a full disk leaves no training checkpoint (``checkpoint()``: its
    path, or None) behind: the file would hold the space the next attempt needs, and the error
    says it is gone. Other failures keep it, so the unit resumes from it."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        path = checkpoint()
        size = path.stat().st_size if path is not None and path.exists() else 0
        if size and (getattr(err, "errno", None) == errno.ENOSPC
                     or shutil.disk_usage(path.parent).free < max(2 * size, 2**26)):
            path.unlink(missing_ok=True)
            said = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise OSError(errno.ENOSPC, f"{said.rstrip('.')}. Its training checkpoint {path.name} "
                          f"({size / 2**20:,.0f} MiB) was removed, so the full disk keeps nothing of this "
                          "unit; it trains from its start next time.") from err
        raise


def _selection_paths(task: methods.Task, method: str, profile: Profile, arch: dict | None, label: str | None
                     ) -> tuple[Path, Path, str, str]:
    """(selection record, best weights, settings fingerprint, inputs fingerprint) of a search."""
    folder = runs_dir(profile, task.dataset, task.base.name)
    label = label or method
    arch = arch or arch_for(task.base.name)
    fingerprint = settings_fingerprint(task, profile, arch if label != method else None, method)
    return (folder / f"{label}-selection.json", folder / f"{label}-best.pt", fingerprint,
            inputs_fingerprint(task))


def _selection_record(record_path: Path, fingerprint: str, inputs: str) -> dict:
    """The stored selection record if current, else an empty one under these fingerprints."""
    return (_load_if_current(record_path, fingerprint, inputs)
            or {"settings": fingerprint, "inputs": inputs, "configs": {}, "best": None})


def stored_selection(task: methods.Task, method: str, profile: Profile, *, arch: dict | None = None,
                     label: str | None = None) -> dict | None:
    """The current selection record of a search (complete or not), or None."""
    record_path, _, fingerprint, inputs = _selection_paths(task, method, profile, arch, label)
    return _load_if_current(record_path, fingerprint, inputs)


def _train_configs(task: methods.Task, method: str, profile: Profile, configs: list[dict], *, arch: dict | None,
                   label: str | None, progress: bool) -> dict:
    """Train the configurations of a search not yet recorded, with the first seed, together
    (``core.train.fit_grid``: one pass over the data for all, as many at once as memory holds;
    LoRA, which trains through the base, one at a time), and return the selection record.

    Many processes may search one grid at once: each configuration is trained by the one that
    holds its lock (taken in one order), and the shared record (and the best weights) change
    only under the selection's lock, re-read there, so no process overwrites another's. Results
    are recorded in ``configs``' order, so equal losses keep the first as the best."""
    record_path, state_path, fingerprint, inputs = _selection_paths(task, method, profile, arch, label)
    folder, label, arch = record_path.parent, label or method, arch or arch_for(task.base.name)

    def fresh() -> dict:
        return _selection_record(record_path, fingerprint, inputs)

    tags = {config_tag(hparams): hparams for hparams in configs}
    recorded = fresh()["configs"]
    with contextlib.ExitStack() as held:
        for tag in sorted(t for t in tags if t not in recorded):
            held.enter_context(unit_lock(folder, f"{label}-{tag}"))
        latest = fresh()
        pending = [t for t in tags if t not in latest["configs"]]
        checkpoints = {t: fit_checkpoint(folder, f"{label}-{t}", fingerprint, inputs) for t in tags}
        while pending:
            count = methods.configs_at_once(task, method, arch, len(pending))
            chunk, pending = pending[:count], pending[count:]
            with _nothing_left_on_full_disk(lambda: next((checkpoints[t] for t in chunk
                                                          if checkpoints[t].exists()), None)):
                if len(chunk) == 1:
                    trained = [methods.train_method(task, method, arch, tags[chunk[0]], profile.seeds[0],
                                                    profile.training, progress=progress,
                                                    checkpoint=checkpoints[chunk[0]])]
                else:
                    trained = methods.train_methods(task, method, arch, [tags[t] for t in chunk], profile.seeds[0],
                                                    profile.training, progress=progress,
                                                    checkpoints=[checkpoints[t] for t in chunk])
                with unit_lock(folder, f"{label}-selection"):
                    latest = fresh()
                    for tag, (model, result) in zip(chunk, trained):
                        best = latest["best"]
                        if best is None or result.best_val_loss < latest["configs"][best]["val_loss"]:
                            _save_state(model, state_path)
                            latest["best"] = tag
                        latest["configs"][tag] = {
                            "hparams": tags[tag], "val_loss": result.best_val_loss, "best_epoch": result.best_epoch,
                            "epochs_run": result.epochs_run, "seconds": result.seconds, "history": result.history,
                            "trained_with": len(chunk), "provenance": provenance(task.base.device)}
                    _write_record(record_path, latest)
            del trained
            malloc.release()  # the chunk's models and optimisers are freed now: give their pages back
        for checkpoint in checkpoints.values():
            checkpoint.unlink(missing_ok=True)
        return latest


def train_config(task: methods.Task, method: str, profile: Profile, hparams: dict, *, arch: dict | None = None,
                 label: str | None = None, progress: bool = False) -> float:
    """One configuration of :func:`select_hparams`'s search (a unit of the grid,
    ``harness.grid``): trained and recorded in the selection record unless it is there
    already; its hyper-validation loss. The search then finds it recorded."""
    record = _train_configs(task, method, profile, [hparams], arch=arch, label=label, progress=progress)
    return record["configs"][config_tag(hparams)]["val_loss"]


def narrowed_profile(task: methods.Task, profile: Profile, method: str = "Plugin", *, progress: bool = False
                     ) -> Profile:
    """The profile with its grid narrowed to the hyperparameters chosen for ``method`` on this
    task (searched first if they are not stored yet): variants that reuse that choice."""
    return narrowed_to(profile, select_hparams(task, method, profile, progress=progress))


def narrowed_to(profile: Profile, selection: dict) -> Profile:
    """The profile with its grid narrowed to a selection record's chosen hyperparameters."""
    chosen = selection["configs"][selection["best"]]["hparams"]
    return profile.replace(grid=dataclasses.replace(profile.grid, **{k: (v,) for k, v in chosen.items()}))


def select_hparams(
    task: methods.Task, method: str, profile: Profile, *, arch: dict | None = None, label: str | None = None,
    progress: bool = True,
) -> dict:
    """Hyperparameter search on hyper-validation loss with the profile's first seed (resumable):
    the whole grid, or one hyperparameter at a time (``grid.search``), edges pushed alike.

    Returns the selection record; the best configuration's weights are in ``<label>-best.pt``.
    ``arch`` overrides the model family's reweighting architecture (ablations); ``label``
    (default: the method) names the stored files, so variants do not overwrite each other.
    """
    label = label or method
    arch = arch or arch_for(task.base.name)
    record_path, _, fingerprint, inputs = _selection_paths(task, method, profile, arch, label)
    folder = record_path.parent
    remove_stale_temporaries(folder)

    def fresh() -> dict:
        return _selection_record(record_path, fingerprint, inputs)

    record = fresh()
    values = {k: list(getattr(profile.grid, k)) for k in grid_keys(method)}

    def evaluate(configs: list[dict]) -> list[float]:
        """The losses of ``configs``, those not recorded yet trained together first."""
        if any(config_tag(hparams) not in record["configs"] for hparams in configs):
            record.update(_train_configs(task, method, profile, configs, arch=arch, label=label, progress=progress))
        return [record["configs"][config_tag(hparams)]["val_loss"] for hparams in configs]

    # The same rule for every method: a choice at an edge pushes that edge one step further.
    if profile.grid.search == "grid":
        extensions = {k: 0 for k in values}
        while True:
            evaluate(list(hparam_grid(profile, method, values)))
            chosen = record["configs"][record["best"]]["hparams"]
            pushed = [k for k in grid_edges(values, chosen) if extensions[k] < profile.grid.extend_edges]
            if not pushed:
                break
            for k in pushed:
                values[k].append(beyond_edge(values[k], chosen[k], k))
                extensions[k] += 1
    else:  # coordinate: one hyperparameter at a time, from the middle of each list
        current = {k: sorted(v)[len(v) // 2] for k, v in values.items()}
        for key in values:
            extended = 0
            while True:
                losses = dict(zip(values[key], evaluate([{**current, key: v} for v in values[key]])))
                current[key] = min(losses, key=losses.get)  # the first of equals, in list order
                step = beyond_edge(values[key], current[key], key)
                if step is None or extended >= profile.grid.extend_edges:
                    break
                values[key].append(step)
                extended += 1
    if record.get("grid") != values:
        with unit_lock(folder, f"{label}-selection"):
            record.update(fresh())
            record["grid"] = values  # the values searched, extensions included
            _write_record(record_path, record)
    return record


def trained_model(task: methods.Task, method: str, profile: Profile, *, arch: dict | None = None,
                  label: str | None = None) -> torch.nn.Module:
    """The first seed's trained model of ``method`` (training it if the grid has not run yet).

    Weights are not committed with the run records: on another machine the chosen
    configuration is trained again (seeded, so it gives the same model) and stored.
    """
    label = label or method
    arch = arch or arch_for(task.base.name)
    selection = select_hparams(task, method, profile, arch=arch, label=label, progress=False)
    folder = runs_dir(profile, task.dataset, task.base.name)
    state = folder / f"{label}-best.pt"
    if not state.exists():
        with unit_lock(folder, f"{label}-best"):
            if not state.exists():
                hparams = selection["configs"][selection["best"]]["hparams"]
                _, _, fingerprint, inputs = _selection_paths(task, method, profile, arch, label)
                checkpoint = fit_checkpoint(folder, f"{label}-{selection['best']}", fingerprint, inputs)
                with _nothing_left_on_full_disk(lambda: checkpoint):
                    model, _ = methods.train_method(  # the chosen configuration's training again: its checkpoint
                        task, method, arch, hparams, profile.seeds[0], profile.training, progress=False,
                        checkpoint=checkpoint)
                    _save_state(model, state)
                checkpoint.unlink(missing_ok=True)
                return model.eval()
    model = methods.build_model(task, method, arch, profile.seeds[0])
    model.load_state_dict(torch.load(state, map_location=task.base.device))
    return model.eval()


def _run_paths(task: methods.Task, method: str, seed: int, profile: Profile, arch: dict | None, label: str
               ) -> tuple[Path, str, str]:
    """(record, settings fingerprint, inputs fingerprint) of a run."""
    path = runs_dir(profile, task.dataset, task.base.name) / f"{label}-seed{seed}.json"
    return path, settings_fingerprint(task, profile, arch if label != method else None, method), inputs_fingerprint(task)


def stored_run(task: methods.Task, method: str, seed: int, profile: Profile, *, arch: dict | None = None,
               label: str | None = None) -> dict | None:
    """The run's current record, or None (none stored, or a stale one): what
    :func:`run_experiment` would return without computing anything."""
    path, fingerprint, inputs = _run_paths(task, method, seed, profile, arch, label or method)
    return _load_if_current(path, fingerprint, inputs)


def run_experiment(
    task: methods.Task, method: str, seed: int, profile: Profile, *, arch: dict | None = None,
    label: str | None = None, force: bool = False, progress: bool = True, selection: dict | None = None,
) -> dict:
    """Train (if needed), decode the test set, score it, store and return the run record.

    ``arch`` and ``label`` as in :func:`select_hparams`; the record's ``method`` is the label.
    ``selection`` (seeds after the first): a :func:`select_hparams` record to train with instead
    of this task's own grid search, for variants whose task changes with the seed (BDPL+Plugin:
    one learned prompt per seed, hyperparameters chosen on the first seed's prompt).
    """
    methods.check_method(method)
    label = label or method
    path, fingerprint, inputs = _run_paths(task, method, seed, profile, arch, label)
    folder = path.parent
    arch = arch or arch_for(task.base.name)
    stored = None if force else _load_if_current(path, fingerprint, inputs)
    if stored is not None:
        return stored
    with unit_lock(folder, path.stem):  # one process computes this run; another waits and reads it
        stored = None if force else _load_if_current(path, fingerprint, inputs)
        if stored is not None:
            return stored
        return _compute_run(task, method, label, seed, profile, arch=arch, path=path, fingerprint=fingerprint,
                            inputs=inputs, progress=progress, selection=selection)


def _compute_run(task: methods.Task, method: str, label: str, seed: int, profile: Profile, *, arch: dict,
                 path: Path, fingerprint: str, inputs: str, progress: bool, selection: dict | None) -> dict:
    """``run_experiment``'s work, under the run's lock: train, decode, score, store."""
    folder = path.parent
    remove_stale_temporaries(folder)
    started = time.perf_counter()
    usage_before = task.base.usage.snapshot() if isinstance(task.base, ApiBlackBox) else None
    model, hparams, training, checkpoint = None, None, None, None
    with _nothing_left_on_full_disk(lambda: checkpoint):
        trains = methods.trained_as(method)  # a proxy arm's expert is NewModel's, its selection and weights too
        # ... under the arm's suffix: ProxyTuning-pretrained's expert is NewModel-pretrained
        train_label = label if trains == method else trains + label.removeprefix(method)
        if trains in methods.TRAINED_METHODS + methods.EXTRA_METHODS:
            selection = selection or select_hparams(task, trains, profile, arch=arch, label=train_label,
                                                    progress=progress)
            chosen = selection["configs"][selection["best"]]
            hparams = chosen["hparams"]
            if seed == profile.seeds[0]:
                model = trained_model(task, trains, profile, arch=arch, label=train_label)
                training = {k: chosen[k] for k in ("val_loss", "best_epoch", "epochs_run", "history")}
            elif trains != method:  # a proxy arm: one expert per seed, trained once for both arms
                model, training = _expert(task, trains, train_label, arch, hparams, seed, profile, progress)
            else:
                # kept until the record is stored: a kill while decoding does not train it again
                checkpoint = fit_checkpoint(folder, f"{path.stem}-{config_tag(hparams)}", fingerprint, inputs)
                model, result = methods.train_method(task, trains, arch, hparams, seed, profile.training,
                                                     progress=progress, checkpoint=checkpoint)
                training = {"val_loss": result.best_val_loss, "best_epoch": result.best_epoch,
                            "epochs_run": result.epochs_run, "history": result.history}
        if method in methods.PROXY_ARMS:
            model = methods.proxy_expert(task, model, arch, seed)
            alpha, losses = methods.choose_alpha(task, method, model, profile.proxy)
            hparams = {**hparams, "alpha": alpha, "top_p": methods.proxy_top_p(method, profile.proxy)}
            training = {**training, "alpha_hyper_losses": losses}
        if method == "TempNet-greedy":
            # Greedy decoding at any positive temperature picks the base's own tokens (tested), so the
            # outputs and their scores are Zeroshot's: read from its stored run, not decoded or scored again.
            zeroshot = run_experiment(task, "Zeroshot", seed, profile, progress=progress)
            predictions, metrics = zeroshot["predictions"], zeroshot["metrics"]
        else:
            predictions = methods.predict(task, method, model, seed, profile.decoding, hparams, progress=progress)
            metrics = compute_metrics(predictions, [list(ex.references) for ex in task.test])
        record = {
            "dataset": task.dataset,
            "model": task.base.name,
            "method": label,
            "seed": seed,
            "profile": profile.name,
            "settings": fingerprint,
            "inputs": inputs,
            "hparams": hparams,
            "training": training,
            "metrics": metrics,
            "predictions": predictions,
            "test_ids": [ex.id for ex in task.test],
            "scale": {
                "train_inputs": len(task.train),
                "hyper_inputs": len(task.hyper),
                "test_inputs": len(task.test),
                "train_pairs": len(task.encoded("train")),
            },
            "seconds": time.perf_counter() - started,
            "provenance": provenance(task.base.device),
        }
        if usage_before is not None:
            # What this run asked of the server, per phase: teacher forcing (the base-output cache,
            # built by the run that needs it first; later runs read it from disk) and decoding.
            record["api_usage"] = task.base.usage.minus(usage_before).as_dict()
        _write_record(path, record)
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)
    return record


def _expert(task: methods.Task, method: str, label: str, arch: dict, hparams: dict, seed: int, profile: Profile,
            progress: bool) -> tuple[torch.nn.Module, dict]:
    """``method``'s model (stored as ``label``) for a later ``seed``, trained once and kept for
    every proxy arm that needs it (the weights and the training's summary, in ``.checkpoints/``
    under a name keyed on the hyperparameters, settings and data, ``fit_checkpoint``; not
    committed): seeded, so each arm gets the model it would have trained itself. A labelled
    variant (a pretrained expert) is keyed on its architecture too."""
    folder = runs_dir(profile, task.dataset, task.base.name)
    name = f"{label}-expert-seed{seed}-{config_tag(hparams)}"
    fingerprint = settings_fingerprint(task, profile, None if label == method else arch, method)
    kept = fit_checkpoint(folder, name, fingerprint, inputs_fingerprint(task))
    with unit_lock(folder, name):
        if kept.exists():
            stored = torch.load(kept, map_location=task.base.device, weights_only=True)
            model = methods.build_model(task, method, arch, seed)
            model.load_state_dict(stored["model"])
            return model.eval(), stored["training"]
        model, result = methods.train_method(task, method, arch, hparams, seed, profile.training, progress=progress)
        training = {"val_loss": result.best_val_loss, "best_epoch": result.best_epoch,
                    "epochs_run": result.epochs_run, "history": result.history}
        atomic_write_with(kept, lambda f: torch.save({"model": model.state_dict(), "training": training}, f))
        return model.eval(), training


def _name_list(value, what: str, example: str) -> list[str]:
    if (isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(v, str) and v for v in value)):
        raise TypeError(f"{what} must be a non-empty list of names, got {value!r}; e.g. {what}={example}.")
    return list(value)


def check_run_arguments(dataset: str, *, model_names=None, method_names=None) -> None:
    """TypeError or ValueError, with what to pass instead, for a dataset that is not one of the
    four, or model/method names that are not a list of known names (a string such as
    ``"Plugin"`` is an error, not seven one-letter methods). None means the default."""
    if not isinstance(dataset, str) or dataset not in data.DATASETS:
        raise ValueError(f"Unknown dataset {dataset!r}; choose one of {list(data.DATASETS)}.")
    if model_names is not None:
        for name in _name_list(model_names, "model_names", "['smollm2-135m-instruct']"):
            models.model_spec(name)  # ValueError naming the known models
    if method_names is not None:
        known = methods.METHODS + methods.EXTRA_METHODS + methods.PROXY_ARMS
        unknown = [m for m in _name_list(method_names, "method_names", "['Zeroshot', 'Plugin']") if m not in known]
        if unknown:
            raise ValueError(f"Unknown method(s) {unknown}; choose from {list(known)}.")


def load_task(base: BlackBoxLM | str, dataset: str, profile: Profile, *, prompt_model: str | None = None
              ) -> methods.Task:
    """The task of a (base model, dataset) pair at the profile's scale, its base-output cache
    under the runs folder of the model whose outputs it holds (a top-k view's: its base's, so
    that the views share one compact cache).

    ``base``: a model name (loaded in the profile's dtype) or a loaded black box.
    ``prompt_model``: the model whose prompt family and chat format the task uses; a
    fine-tuned base keeps the format of the model it came from. Default: the base itself.
    """
    if isinstance(base, str):
        base = models.load_base_model(base, dtype=profile.dtype)
    return methods.make_task(base, dataset, profile, prompt_model=prompt_model,
                             cache_dir=runs_dir(profile, dataset, base.states_name) / "cache")


def run_table(
    dataset: str,
    profile: Profile,
    *,
    model_names: list[str] | None = None,
    method_names: list[str] | None = None,
    force: bool = False,
) -> list[dict]:
    """Every (model, method, seed) run of one dataset's table, resuming finished ones.

    Zeroshot and TempNet-greedy are deterministic (greedy, no training), so each runs once,
    with the first seed.
    The arguments are checked first (:func:`check_run_arguments`): a wrong one raises before
    any model is loaded or any file written.
    """
    check_run_arguments(dataset, model_names=model_names, method_names=method_names)
    records = []
    for model_name, jobs in table_jobs(profile, model_names, method_names).items():
        task = load_task(model_name, dataset, profile)
        for method, seed in tqdm(jobs, desc=f"{dataset} / {model_name}"):
            records.append(run_experiment(task, method, seed, profile, force=force, progress=False))
    return records


def table_jobs(profile: Profile, model_names: list[str] | None = None, method_names: list[str] | None = None
               ) -> dict[str, list[tuple[str, int]]]:
    """The (method, seed) runs of a table per base model, in :func:`run_table`'s order (also the
    grid's units: ``harness.grid``). Zeroshot and TempNet-greedy run with the first seed only."""
    return {model_name: [(method, seed)
                         for method in method_names or methods.METHODS
                         for seed in (profile.seeds[:1] if method in methods.UNSEEDED_METHODS else profile.seeds)]
            for model_name in model_names or profile.base_models}


def load_runs(profile: Profile | str, dataset: str) -> list[dict]:
    """All stored run records of a dataset in a profile."""
    root = config.results_dir(profile) / "runs" / dataset
    return [read_json(p) for p in sorted(root.glob("*/*-seed*.json"))]


def notebook_datasets(profile: Profile, datasets: str | list[str] | None = None) -> list[str]:
    """The datasets given (one name or a list); by default the profile's ``wrapper.datasets``
    (all four when that is null)."""
    if datasets is None:
        datasets = profile.wrapper.datasets or data.DATASETS
    if not isinstance(datasets, (str, list, tuple)):
        raise TypeError(f"datasets must be a dataset name or a list of them, got {datasets!r}.")
    chosen = [datasets] if isinstance(datasets, str) else list(datasets)
    unknown = [d for d in chosen if d not in data.DATASETS]
    if unknown:
        raise ValueError(f"Unknown dataset(s) {unknown}; choose from {list(data.DATASETS)}.")
    return chosen
