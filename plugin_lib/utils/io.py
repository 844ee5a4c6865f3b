"""Atomic file writes: a result is either completely there or not at all, so an interrupted
run never leaves a half-written file that a resumed run would trust. Files get the user's normal
permissions (``0666`` less the umask), as ``open(path, "w")`` would give them, not mkstemp's 0600."""
from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, BinaryIO

from .locks import owner_gone, owner_tag


def current_umask() -> int:
    """The process's umask, read without changing it where /proc allows (thread-safe)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_with(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """``write(f)`` into a temporary file unique to this call beside ``path``, flushed to disk and
    renamed to ``path`` when complete; removed on any failure (a full disk, Ctrl-C)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, (f".{glob.escape(path.name)}.*.tmp",))  # what a killed writer of it left
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path), suffix=".tmp")
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp creates 0600
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write_with(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n")


class CorruptFileError(ValueError):
    """A stored file that cannot be parsed (truncated, e.g. by a full disk); names the file."""


def read_json(path: str | os.PathLike) -> Any:
    """The JSON in ``path``; CorruptFileError naming the file when it is not valid JSON."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as err:
            raise CorruptFileError(
                f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}): the file is "
                "truncated or damaged. Delete it to have it made again, or restore it (git checkout -- <file> "
                "for a committed result).") from err


STALE_AFTER_S = 3600


def temporary_prefix(path: Path) -> str:
    """``.<name>.<host~pid>.``: a temporary beside ``path`` that names its writer, so that
    ``remove_stale_temporaries`` reaps it only once that writer has ended."""
    return f".{path.name}.{owner_tag()}."


def remove_stale_temporaries(folder: str | os.PathLike, patterns: tuple[str, ...] = (".*.tmp",),
                             max_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove temporary files or directories (``patterns``, e.g. ``.<name>.<host~pid>.<random>.tmp``
    of the atomic writes) in ``folder`` left by a writer that has ended: one of this host whose pid
    no longer runs, at once; one of another host, or a name without an owner (older files), once
    not modified for ``max_age_s`` seconds (a live writer touches its file far more often). A
    temporary of a running writer is never removed. Returns what was removed; a folder that
    does not exist is fine."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed, cutoff = [], time.time() - max_age_s
    for pattern in patterns:
        for path in folder.glob(pattern):
            parts = path.name.split(".")
            gone = owner_gone(parts[-3]) if len(parts) >= 4 else None
            try:
                if gone is False or (gone is None and path.stat().st_mtime >= cutoff):
                    continue
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed.append(path)
            except FileNotFoundError:  # another process removed it first
                pass
    return removed


def reap_tree(root: str | os.PathLike) -> list[Path]:
    """Remove, anywhere under ``root``, the temporaries of writers of this host that have ended
    (a kill -9 skips their cleanup): atomic writes' and artifacts' ``.<name>.<host~pid>.*.tmp``,
    base-output caches' ``.<name>.<host~pid>.<random>.partial``. Only a named, ended owner counts:
    a resumable state without one (a BDPL search's ``.<record>.partial``) is never touched.
    ``run_all.sh`` calls it on the profile's results and the cache folder once it holds the lock."""
    removed = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            parts = name.split(".")
            if name.startswith(".") and parts[-1] in ("tmp", "partial") and len(parts) >= 4 \
                    and owner_gone(parts[-3]) is True:
                path = Path(dirpath) / name
                try:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
                except FileNotFoundError:
                    continue
                removed.append(path)
        dirnames[:] = [d for d in dirnames if Path(dirpath, d) not in removed]
    return removed


def folder_bytes(root: str | os.PathLike) -> int:
    """The bytes of the plain files under ``root`` (links not followed); 0 when it does not exist."""
    return sum(path.stat().st_size for path in Path(root).rglob("*") if path.is_file() and not path.is_symlink())


def is_full_disk(err: BaseException, folder: str | os.PathLike, need: int = 2**26) -> bool:
    """Whether ``err`` came from a full disk under ``folder``: ENOSPC, or less than ``need`` bytes
    left there. torch's serializer reports a full disk without an errno ("file write failed",
    "unexpected pos"), so the free space decides; those words alone prove nothing."""
    if getattr(err, "errno", None) == errno.ENOSPC or "No space left" in str(err):
        return True
    try:
        return shutil.disk_usage(folder).free < need
    except OSError:
        return False
