"""Hyperparameter search: the same rule for every trained method.

Hyperparameters are chosen on hyper-validation loss over the profile's grid with the first
seed (the whole grid, or one hyperparameter at a time); a choice at an edge of the grid pushes
that edge one step further. Later seeds reuse the choice. The search resumes: every
configuration's loss is recorded as it finishes (``<label>-selection.json``), together with the
weights of the best one so far (``<label>-best.pt``), under the run store's locks
(``harness.running.run_store``), so many processes can search one grid at once.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from ...utils import malloc
from ...utils.io import remove_stale_temporaries
from ...utils.provenance import provenance
from ...utils.record_manifest import write_record
from .. import methods, models, tasks
from . import run_store
from ..profile import Profile
from ...core.grid_search import beyond_edge, grid_edges
from .run_keys import config_tag, grid_keys, hparam_grid


def arch_for(model: str) -> dict:
    """The reweighting architecture of a base model's family: the one place searches and runs ask
    for it, so that a test can give them all a smaller one."""
    return models.arch_for(model)


def selection_files(task: tasks.Task, method: str, profile: Profile, arch: dict | None, label: str | None
                    ) -> run_store.MethodFiles:
    """A search's files: ``<label>-selection.json``, the best weights ``<label>-best.pt``, its
    checkpoints and locks, under the search's keys (the family's architecture by default)."""
    return run_store.method_files(task, profile, method, label, arch or arch_for(task.base.name))


def _selection_record(files: run_store.MethodFiles, label: str) -> dict:
    """The stored selection record if current, else an empty one under these keys."""
    return (files.current(f"{label}-selection")
            or {"settings": files.settings, "inputs": files.inputs, "configs": {}, "best": None})


def stored_selection(task: tasks.Task, method: str, profile: Profile, *, arch: dict | None = None,
                     label: str | None = None) -> dict | None:
    """The current selection record of a search (complete or not), or None."""
    return selection_files(task, method, profile, arch, label).current(f"{label or method}-selection")


def _train_configs(task: tasks.Task, method: str, profile: Profile, configs: list[dict], *, arch: dict | None,
                   label: str | None, progress: bool) -> dict:
    """Train the configurations of a search not yet recorded, with the first seed, together
    (``core.train.fit_grid``: one pass over the data for all, as many at once as memory holds;
    LoRA, which trains through the base, one at a time), and return the selection record.

    Many processes may search one grid at once: each configuration is trained by the one that
    holds its lock (taken in one order), and the shared record (and the best weights) change
    only under the selection's lock, re-read there, so no process overwrites another's. Equal
    losses keep the configuration first in the grid's order as the best, whatever order the
    processes finish in (one of the grid's own before one its edges added)."""
    files = selection_files(task, method, profile, arch, label)
    label, arch = label or method, arch or arch_for(task.base.name)
    specs = {config_tag(hparams): methods.TrainingSpec(method, arch, hparams, profile.seeds[0], profile.training)
             for hparams in configs}
    # Equal losses keep the configuration first in the grid's order, whichever finished first:
    # units of one search trained at once in other processes choose as one process does.
    grid_order = {config_tag(hparams): i for i, hparams in enumerate(hparam_grid(profile, method))}
    recorded = _selection_record(files, label)["configs"]
    with contextlib.ExitStack() as held:
        for tag in sorted(t for t in specs if t not in recorded):
            held.enter_context(files.lock(f"{label}-{tag}"))
        latest = _selection_record(files, label)
        pending = [t for t in specs if t not in latest["configs"]]
        specs = {t: dataclasses.replace(spec, checkpoint=files.checkpoint(f"{label}-{t}")) for t, spec in specs.items()}
        while pending:
            count = methods.configs_at_once(task, method, arch, len(pending))
            chunk, pending = pending[:count], pending[count:]
            with run_store.nothing_left_on_full_disk(lambda: next((specs[t].checkpoint for t in chunk
                                                                   if specs[t].checkpoint.exists()), None)):
                if len(chunk) == 1:
                    trained = [methods.train(task, specs[chunk[0]], progress=progress)]
                else:
                    trained = methods.train_together(task, [specs[t] for t in chunk], progress=progress)
                with files.lock(f"{label}-selection"):
                    latest = _selection_record(files, label)
                    for tag, (model, result) in zip(chunk, trained):
                        best = latest["best"]
                        if best is None or ((result.best_val_loss, grid_order.get(tag, len(grid_order)))
                                            < (latest["configs"][best]["val_loss"], grid_order.get(best, len(grid_order)))):
                            run_store.save_state(model, files.folder / f"{label}-best.pt")
                            latest["best"] = tag
                        latest["configs"][tag] = {
                            "hparams": specs[tag].hparams, "val_loss": result.best_val_loss,
                            "best_epoch": result.best_epoch, "epochs_run": result.epochs_run,
                            "seconds": result.seconds, "history": result.history,
                            "trained_with": len(chunk), "provenance": provenance(task.base.device)}
                        if result.stacked:  # the same up to batched kernels' rounding
                            latest["configs"][tag]["stacked_training"] = True
                    write_record(files.folder / f"{label}-selection.json", latest)
            del trained
            malloc.release()  # the chunk's models and optimisers are freed now: give their pages back
        for spec in specs.values():
            spec.checkpoint.unlink(missing_ok=True)
        return latest


def train_config(task: tasks.Task, method: str, profile: Profile, hparams: dict, *, arch: dict | None = None,
                 label: str | None = None, progress: bool = False) -> float:
    """One configuration of :func:`select_hparams`'s search (a unit of the grid,
    ``harness.grid``): trained and recorded in the selection record unless it is there
    already; its hyper-validation loss. The search then finds it recorded."""
    record = _train_configs(task, method, profile, [hparams], arch=arch, label=label, progress=progress)
    return record["configs"][config_tag(hparams)]["val_loss"]


def narrowed_profile(task: tasks.Task, profile: Profile, method: str = "Plugin", *, progress: bool = False
                     ) -> Profile:
    """The profile with its grid narrowed to the hyperparameters chosen for ``method`` on this
    task (searched first if they are not stored yet): variants that reuse that choice."""
    return narrowed_to(profile, select_hparams(task, method, profile, progress=progress))


def narrowed_to(profile: Profile, selection: dict) -> Profile:
    """The profile with its grid narrowed to a selection record's chosen hyperparameters."""
    chosen = selection["configs"][selection["best"]]["hparams"]
    return profile.replace(grid=dataclasses.replace(profile.grid, **{k: (v,) for k, v in chosen.items()}))


def select_hparams(
    task: tasks.Task, method: str, profile: Profile, *, arch: dict | None = None, label: str | None = None,
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
    files = selection_files(task, method, profile, arch, label)
    remove_stale_temporaries(files.folder)
    record = _selection_record(files, label)
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
        with files.lock(f"{label}-selection"):
            record.update(_selection_record(files, label))
            record["grid"] = values  # the values searched, extensions included
            write_record(files.folder / f"{label}-selection.json", record)
    return record


def trained_model(task: tasks.Task, method: str, profile: Profile, *, arch: dict | None = None,
                  label: str | None = None) -> torch.nn.Module:
    """The first seed's trained model of ``method`` (searched and trained if not stored yet)."""
    label, arch = label or method, arch or arch_for(task.base.name)
    selection = select_hparams(task, method, profile, arch=arch, label=label, progress=False)
    hparams = selection["configs"][selection["best"]]["hparams"]
    spec = methods.TrainingSpec(method, arch, hparams, profile.seeds[0], profile.training)
    return best_model(task, profile, spec, selection, label)


def best_model(task: tasks.Task, profile: Profile, spec: methods.TrainingSpec, selection: dict, label: str
               ) -> torch.nn.Module:
    """The first seed's model of a finished search (``selection``, stored as ``label``): its
    best configuration, trained as ``spec``.

    Weights are not committed with the run records: on another machine the chosen
    configuration is trained again (seeded, so it gives the same model) and stored.
    """
    files = selection_files(task, spec.method, profile, spec.arch, label)
    state = files.folder / f"{label}-best.pt"
    if not state.exists():
        with files.lock(f"{label}-best"):
            if not state.exists():
                spec = dataclasses.replace(spec, checkpoint=files.checkpoint(f"{label}-{selection['best']}"))
                with run_store.nothing_left_on_full_disk(lambda: spec.checkpoint):
                    model, _ = methods.train(task, spec, progress=False)  # the chosen configuration's training again
                    run_store.save_state(model, state)
                spec.checkpoint.unlink(missing_ok=True)
                return model.eval()
    model = methods.build_model(task, spec.method, spec.arch, spec.seed)
    model.load_state_dict(torch.load(state, map_location=task.base.device))
    return model.eval()
