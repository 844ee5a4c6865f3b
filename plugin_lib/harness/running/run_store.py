"""The run store: where runs live, how their records and weights are written, and when a stored
one still counts.

A run's record is ``results/<profile>/runs/<dataset>/<model>/<method>-seed<k>.json``; a grid
search's is ``<label>-selection.json`` beside it, with the chosen weights in ``<label>-best.pt``.
Records are written atomically and their hashes go into the store's manifest
(``utils.record_manifest.write_record``).

A stored record counts only if it was made from the same inputs: its ``settings`` (a hash of
the profile's settings that shape it, ``run_keys.settings_fingerprint``) and its ``inputs`` (a
hash of the task's data and the base model's spec, ``run_keys.inputs_fingerprint``) must both
match the current ones (``MethodFiles.current``); otherwise it is stale and is made again,
never silently reused.

Each unit of work has a lock (:func:`unit_lock`) and a training checkpoint (``MethodFiles.checkpoint``),
so that many processes share one store and a killed unit resumes; a unit that fails on a full
disk leaves nothing of itself behind (:func:`nothing_left_on_full_disk`).
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

from ...utils.io import atomic_write_with, is_full_disk, read_json, remove_stale_temporaries
from ...utils.locks import StoreLock
from .. import machine
from ..profile import Profile
from .. import tasks
from .run_keys import inputs_fingerprint, is_current, settings_fingerprint


def runs_dir(profile: Profile, dataset: str, model: str) -> Path:
    return machine.results_dir(profile) / "runs" / dataset / model.replace("/", "--")


@dataclasses.dataclass(frozen=True)
class MethodFiles:
    """One method's files in a run folder (its runs, its search, their locks and checkpoints) and
    the keys that make them current: the ``settings`` and ``inputs`` fingerprints."""

    folder: Path
    settings: str
    inputs: str

    def current(self, name: str) -> dict | None:
        """The record ``<name>.json`` if it was made under these keys, else None."""
        path = self.folder / f"{name}.json"
        record = read_json(path) if path.exists() else None
        return record if record is not None and is_current(record, self.settings, self.inputs) else None

    def lock(self, name: str) -> StoreLock:
        return unit_lock(self.folder, name)

    def checkpoint(self, name: str) -> Path:
        """Where the training of unit ``name`` keeps its state (``core.train.fit``) until its
        result is stored, in ``.checkpoints/``: named after the unit (its hyperparameters among
        them) and these keys, so that no training of other settings or data resumes from it. The
        unit's checkpoints of other keys untouched for an hour, and temporaries of killed
        writers, are removed."""
        kept = self.folder / ".checkpoints"
        remove_stale_temporaries(kept)
        key = hashlib.sha256(f"{self.settings}:{self.inputs}".encode()).hexdigest()[:12]
        path = kept / f"{name}-{key}.pt"
        for other in kept.glob(f"{glob.escape(name)}-*.pt") if kept.is_dir() else ():
            if other != path and len(other.stem) == len(path.stem) and time.time() - other.stat().st_mtime > 3600:
                other.unlink(missing_ok=True)
        return path


def method_files(task: tasks.Task, profile: Profile, method: str, label: str | None = None,
                 arch: dict | None = None) -> MethodFiles:
    """Where ``method`` (stored as ``label``, default the method) keeps its files for this task.
    ``arch`` enters the settings' key only for a labelled variant: the family's own architecture
    is part of the base's spec already."""
    label = label or method
    return MethodFiles(runs_dir(profile, task.dataset, task.base.name),
                       settings_fingerprint(task, profile, arch if label != method else None, method),
                       inputs_fingerprint(task))


def unit_lock(folder: Path, name: str) -> StoreLock:
    """The lock of one unit of work in a run folder (``.locks/<name>.lock``): the process that
    holds it computes the unit; another waits, then finds the unit's record and reads it."""
    return StoreLock(folder / ".locks" / f"{name}.lock")


def save_state(model: torch.nn.Module, path: Path) -> None:
    """The model's weights at ``path``, atomically (``atomic_write_with``)."""
    try:
        atomic_write_with(path, lambda f: torch.save(model.state_dict(), f))
    except BaseException as err:
        needed = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        if isinstance(err, (OSError, RuntimeError)) and is_full_disk(err, path.parent, need=2 * needed):
            free = shutil.disk_usage(path.parent).free
            raise OSError(errno.ENOSPC, f"the disk under {path.parent} is full ({free / 2**20:,.0f} MiB free; "
                          f"these weights need {needed / 2**20:,.0f} MiB), so {path.name} was not written and no "
                          "stored result was replaced. Free disk space, or point PLUGIN_RESULTS_DIR at a larger "
                          "disk, and run again: finished runs are kept.") from err
        raise


@contextlib.contextmanager
def nothing_left_on_full_disk(checkpoint):
    """A unit that fails on a full disk leaves no training checkpoint (``checkpoint()``: its
    path, or None) behind: the file would hold the space the next attempt needs, and the error
    says it is gone. Other failures keep it, so the unit resumes from it."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        path = checkpoint()
        size = path.stat().st_size if path is not None and path.exists() else 0
        if size and is_full_disk(err, path.parent, need=max(2 * size, 2**26)):
            path.unlink(missing_ok=True)
            said = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise OSError(errno.ENOSPC, f"{said.rstrip('.')}. Its training checkpoint {path.name} "
                          f"({size / 2**20:,.0f} MiB) was removed, so the full disk keeps nothing of this "
                          "unit; it trains from its start next time.") from err
        raise


def load_runs(profile: Profile | str, dataset: str) -> list[dict]:
    """All stored run records of a dataset in a profile."""
    root = machine.results_dir(profile) / "runs" / dataset
    return [read_json(p) for p in sorted(root.glob("*/*-seed*.json"))]
