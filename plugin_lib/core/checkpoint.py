"""A training's checkpoint on disk (``core.train.fit`` keeps one every few minutes): written whole
or not at all, and read back only for the same configuration, data and device type.

The core keeps its own writer rather than ``utils.io``'s: it imports nothing outside the core;
the harness reaps temporaries.
"""
from __future__ import annotations

import glob
import os
import tempfile
import warnings
from pathlib import Path

import torch

from .cache_files import current_umask, owner_tag, remove_stale_partials


def save_atomically(path: str | Path, state: dict) -> None:
    """``torch.save`` into a temporary beside ``path``, flushed and renamed when complete: a
    kill mid-write leaves the previous checkpoint whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path.parent, pattern=f".{glob.escape(path.name)}.*.tmp")  # what a killed writer left
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{owner_tag()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # the user's normal permissions, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path | None, identity: dict) -> dict | None:
    """The training state kept at ``path`` by ``fit``, if there is a readable one of this
    configuration, data and device type (an unreadable one is trained over, with a warning)."""
    if path is None or not Path(path).exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises many kinds for a damaged file
        warnings.warn(f"The training checkpoint {path} cannot be read ({err}); training from the start.")
        return None
    return state if all(state.get(k) == v for k, v in identity.items()) else None
