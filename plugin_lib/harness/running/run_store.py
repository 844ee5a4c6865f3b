"""The run store: where runs live, how their records and weights are written, and when a stored
one still counts.

A run's record is ``results/<profile>/runs/<dataset>/<model>/<method>-seed<k>.json``; a grid
search's is ``<label>-selection.json`` beside it, with the chosen weights in ``<label>-best.pt``.
Records are written atomically and their hashes go into the store's manifest
(``utils.record_manifest.write_record``).

A stored record counts only if it was made from the same inputs: its ``settings`` (a hash of
the profile's settings that shape it, ``run_keys.settings_fingerprint``) and its ``inputs`` (a
hash of the task's data and the base model's spec, ``run_keys.inputs_fingerprint``) must both
match the current ones; otherwise it is stale and is made again, never silently reused.

Each unit of work has a lock (:func:`unit_lock`) and a training checkpoint (:func:`fit_checkpoint`),
so that many processes share one store and a killed unit resumes; a unit that fails on a full
disk leaves nothing of itself behind (:func:`nothing_left_on_full_disk`).
"""
from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import shutil
import time
from pathlib import Path

import torch

from ...utils.io import atomic_write_with, is_full_disk, read_json, remove_stale_temporaries
from ...utils.locks import StoreLock
from .. import profile as config
from ..profile import Profile
from .run_keys import is_current


def runs_dir(profile: Profile, dataset: str, model: str) -> Path:
    return config.results_dir(profile) / "runs" / dataset / model.replace("/", "--")


def load_if_current(path: Path, fingerprint: str, inputs: str) -> dict | None:
    if not path.exists():
        return None
    record = read_json(path)
    return record if is_current(record, fingerprint, inputs) else None


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
    root = config.results_dir(profile) / "runs" / dataset
    return [read_json(p) for p in sorted(root.glob("*/*-seed*.json"))]
