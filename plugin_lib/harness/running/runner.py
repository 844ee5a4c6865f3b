"""Runs (dataset, base model, method, seed) experiments and stores each as one JSON file.

A run's record (``harness.running.run_store``) holds the test predictions, the seven metrics, the
chosen hyperparameters (``harness.running.search``), the training history and the scale it was produced
at (and, for a model behind an API, the requests, tokens and seconds it cost: ``api_usage``).
A run whose current record exists is not redone (unless ``force``), so an interrupted notebook
resumes where it stopped; a stale one (other settings or data) is made again.
Arguments are checked before anything is loaded or written (:func:`check_run_arguments`).
"""
from __future__ import annotations

import dataclasses
import time

import torch
from tqdm.auto import tqdm

from ... import data
from ...core.api import ApiBlackBox
from ...core.blackbox import BlackBoxLM
from ...metrics import compute_metrics
from ...utils.io import atomic_write_with, remove_stale_temporaries
from ...utils.provenance import provenance
from ...utils.record_manifest import write_record
from .. import methods, models, tasks
from . import run_store, search
from .run_keys import config_tag
from ..profile import Profile


def stored_run(task: tasks.Task, method: str, seed: int, profile: Profile, *, arch: dict | None = None,
               label: str | None = None) -> dict | None:
    """The run's current record, or None (none stored, or a stale one): what
    :func:`run_experiment` would return without computing anything."""
    label = label or method
    return run_store.method_files(task, profile, method, label, arch).current(f"{label}-seed{seed}")


def run_experiment(
    task: tasks.Task, method: str, seed: int, profile: Profile, *, arch: dict | None = None,
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
    files, name = run_store.method_files(task, profile, method, label, arch), f"{label}-seed{seed}"
    arch = arch or search.arch_for(task.base.name)
    stored = None if force else files.current(name)
    if stored is not None:
        return stored
    with files.lock(name):  # one process computes this run; another waits and reads it
        stored = None if force else files.current(name)
        if stored is not None:
            return stored
        return _compute_run(task, method, label, seed, profile, arch=arch, files=files, progress=progress,
                            selection=selection)


def _training_spec(task: tasks.Task, method: str, label: str, seed: int, profile: Profile, *, arch: dict,
                   files: run_store.MethodFiles, progress: bool, selection: dict | None
                   ) -> tuple[methods.TrainingSpec, dict, str]:
    """(how the run's small model is trained, its search's selection record, the search's label):
    a proxy arm's is its expert, NewModel's model, with NewModel's selection and first seed's
    weights, under the arm's suffix (ProxyTuning-pretrained's expert is NewModel-pretrained). A
    later seed's own training keeps a checkpoint until the record is stored: a kill while
    decoding does not train it again."""
    trains = methods.trained_as(method)
    train_label = label if trains == method else trains + label.removeprefix(method)
    selection = selection or search.select_hparams(task, trains, profile, arch=arch, label=train_label,
                                                   progress=progress)
    hparams = selection["configs"][selection["best"]]["hparams"]
    spec = methods.TrainingSpec(trains, arch, hparams, seed, profile.training)
    if seed != profile.seeds[0] and trains == method:
        spec = dataclasses.replace(spec, checkpoint=files.checkpoint(f"{label}-seed{seed}-{config_tag(hparams)}"))
    return spec, selection, train_label


def _trained(task: tasks.Task, method: str, spec: methods.TrainingSpec, selection: dict, train_label: str,
             profile: Profile, progress: bool) -> tuple[torch.nn.Module, dict]:
    """(model, the training's summary) of ``spec``: the first seed's is the search's best; a
    proxy arm's later seed's expert is trained once for both arms (:func:`_expert`)."""
    if spec.seed == profile.seeds[0]:
        chosen = selection["configs"][selection["best"]]
        model = search.best_model(task, profile, spec, selection, train_label)
        return model, {k: chosen[k] for k in ("val_loss", "best_epoch", "epochs_run", "history")}
    if spec.method != method:  # a proxy arm's expert
        expert_files = run_store.method_files(task, profile, spec.method, train_label, spec.arch)
        return _expert(task, spec, expert_files, f"{train_label}-expert-seed{spec.seed}", progress)
    model, result = methods.train(task, spec, progress=progress)
    return model, _summary(result)


def _summary(result) -> dict:
    return {"val_loss": result.best_val_loss, "best_epoch": result.best_epoch, "epochs_run": result.epochs_run,
            "history": result.history}


def _compute_run(task: tasks.Task, method: str, label: str, seed: int, profile: Profile, *, arch: dict,
                 files: run_store.MethodFiles, progress: bool, selection: dict | None) -> dict:
    """``run_experiment``'s work, under the run's lock: train, decode, score, store."""
    remove_stale_temporaries(files.folder)
    started = time.perf_counter()
    usage_before = task.base.usage.snapshot() if isinstance(task.base, ApiBlackBox) else None
    model, spec, hparams, training = None, None, None, None
    with run_store.nothing_left_on_full_disk(lambda: spec and spec.checkpoint):
        if methods.trained_as(method) in methods.TRAINED_METHODS + methods.EXTRA_METHODS:
            spec, selection, train_label = _training_spec(task, method, label, seed, profile, arch=arch, files=files,
                                                          progress=progress, selection=selection)
            model, training = _trained(task, method, spec, selection, train_label, profile, progress)
            hparams = spec.hparams
        if method in methods.PROXY_ARMS:
            model = methods.proxy_expert(task, model, spec.arch, spec.seed)
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
            "settings": files.settings,
            "inputs": files.inputs,
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
        if methods.static_decoding(task, method):
            record["static_decoding"] = True  # same tokens up to the kernels' rounding, as on another device
        if usage_before is not None:
            # What this run asked of the server, per phase: teacher forcing (the base-output cache,
            # built by the run that needs it first; later runs read it from disk) and decoding.
            record["api_usage"] = task.base.usage.minus(usage_before).as_dict()
        write_record(files.folder / f"{label}-seed{seed}.json", record)
    if spec is not None and spec.checkpoint is not None:
        spec.checkpoint.unlink(missing_ok=True)
    return record


def _expert(task: tasks.Task, spec: methods.TrainingSpec, files: run_store.MethodFiles, name: str, progress: bool
            ) -> tuple[torch.nn.Module, dict]:
    """The expert trained as ``spec`` for a later seed, trained once and kept for every proxy arm
    that needs it (the weights and the training's summary, in ``.checkpoints/`` under ``name``
    and the hyperparameters, keyed on the expert's settings and data, ``MethodFiles.checkpoint``; not
    committed): seeded, so each arm gets the model it would have trained itself. A labelled
    variant (a pretrained expert) is keyed on its architecture too."""
    name = f"{name}-{config_tag(spec.hparams)}"
    kept = files.checkpoint(name)
    with files.lock(name):
        if kept.exists():
            stored = torch.load(kept, map_location=task.base.device, weights_only=True)
            model = methods.build_model(task, spec.method, spec.arch, spec.seed)
            model.load_state_dict(stored["model"])
            return model.eval(), stored["training"]
        model, result = methods.train(task, spec, progress=progress)
        training = _summary(result)
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
              ) -> tasks.Task:
    """The task of a (base model, dataset) pair at the profile's scale, its base-output cache
    under the runs folder of the model whose outputs it holds (a top-k view's: its base's, so
    that the views share one compact cache).

    ``base``: a model name (loaded in the profile's dtype) or a loaded black box.
    ``prompt_model``: the model whose prompt family and chat format the task uses; a
    fine-tuned base keeps the format of the model it came from. Default: the base itself.
    """
    if isinstance(base, str):
        base = models.load_base_model(base, dtype=profile.dtype)
    return tasks.make_task(base, dataset, profile, prompt_model=prompt_model,
                             cache_dir=run_store.runs_dir(profile, dataset, base.states_name) / "cache")


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
