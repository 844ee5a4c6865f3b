"""The manifest of a run store: ``RECORDS.sha256`` beside the store's ``runs/`` folder lists every
stored run record with the sha256 of its content, in sha256sum's format (``<hex>  <path>``, the
path relative to the store, so ``sha256sum -c RECORDS.sha256`` checks it there too).

A record with an edited number is still valid JSON: only its hash says that it is not what the
store wrote. So:

- The store writes every run record with :func:`write_record` (``harness.running.runner``,
  ``experiments.table5``): the record atomically, then, under the store's lock, its hash into
  the manifest, which is itself replaced atomically. Entries whose file is gone (deleted so that
  it is recomputed) are dropped then, so after any write the manifest lists exactly the records
  there, whichever process wrote them (a notebook, the grid, run_all.sh).
- A store without a manifest (made before there was one, or laid from copies) is adopted as it
  stands by the first write, or by ``plugin-repro stamp --write-manifest`` (:func:`adopt`).
- :func:`verify` names the records whose content differs from their hash (edited after the store
  wrote them) and those the manifest does not list: the store lists each record as it writes it,
  so such a record was not written by it (copied in, written by hand or by an older checkout), or
  its writer was stopped between the record and its hash. A listed record that is absent is not
  a fault: deleting a record is how it is recomputed.

A record is a ``.json`` file at least two folders below ``runs/`` (``runs/<dataset>/<model>/``),
outside hidden folders (locks, checkpoints) and ``cache/``; a hidden file is a temporary.
Content is hashed with CRLF read as LF, as a Windows checkout of the committed records has it.
"""
from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Any

from .io import atomic_write_json
from .locks import StoreLock, owner_tag

MANIFEST = "RECORDS.sha256"
RUNS = "runs"


class ManifestError(ValueError):
    """A manifest that cannot be read (a merge conflict, a hand edit); names the file."""


def is_record(parts: tuple[str, ...]) -> bool:
    """Whether a path inside a store, as its parts (``("runs", "e2e", "base", "Plugin-seed0.json")``),
    is a run record."""
    return (len(parts) >= 4 and parts[0] == RUNS and parts[-1].endswith(".json")
            and not any(p.startswith(".") or p == "cache" for p in parts))


def store_of(path: str | os.PathLike) -> tuple[Path, str] | None:
    """(the store, the record's path in it) of a run record; None for any other file. The store
    is the folder holding the nearest ``runs/`` above the file (``results/local``, or
    ``results/local/api`` for notebook 14's runs)."""
    parts = Path(os.path.abspath(path)).parts
    if RUNS not in parts:
        return None
    at = len(parts) - 1 - parts[::-1].index(RUNS)
    if not is_record(parts[at:]):
        return None
    return Path(*parts[:at]), "/".join(parts[at:])


def stores(folder: str | os.PathLike) -> list[Path]:
    """The run stores of a profile's folder: itself and any folder in it with a ``runs/`` of its
    own (``api``: notebook 14's runs at their own scale)."""
    folder = Path(folder)
    inside = sorted(p for p in folder.iterdir() if p.is_dir() and (p / RUNS).is_dir()) if folder.is_dir() else []
    return ([folder] if (folder / RUNS).is_dir() else []) + inside


def records(store: str | os.PathLike) -> list[str]:
    """The run records in ``store``, as paths relative to it, sorted. Hidden folders and caches
    are not entered (they hold no record; a cache may hold many large files)."""
    store = Path(store)
    found = []
    for top, folders, files in os.walk(store / RUNS):
        folders[:] = [f for f in folders if not f.startswith(".") and f != "cache"]
        parts = Path(top).relative_to(store).parts
        found += ["/".join(parts + (name,)) for name in files if is_record(parts + (name,))]
    return sorted(found)


def digest(content: bytes) -> str:
    return hashlib.sha256(content.replace(b"\r\n", b"\n")).hexdigest()


def content_hash(path: str | os.PathLike) -> str:
    return digest(Path(path).read_bytes())


def manifest_path(store: str | os.PathLike) -> Path:
    return Path(store) / MANIFEST


def read_manifest(store: str | os.PathLike) -> dict[str, str] | None:
    """{record path: sha256} of the store's manifest; None when it has none."""
    path = manifest_path(store)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    listed = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep:
            digest, sep, name = line.partition(" *")  # sha256sum's binary mode
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest) or not name:
            raise ManifestError(f"{path}, line {number}, is not `<sha256>  <record>`: the manifest is damaged. Restore "
                                f"it (git checkout -- {MANIFEST} for a committed store), or delete it and list the "
                                "records as they are with `plugin-repro stamp --profile NAME --write-manifest`.")
        listed[name] = digest
    return listed


def _write_manifest(store: Path, listed: dict[str, str]) -> None:
    """The manifest replaced atomically, with the temporary named as ``utils.io`` names its own
    (so that it is reaped and ignored the same way); ``open(.., "x")`` gives the user's permissions."""
    path = manifest_path(store)
    tmp = path.with_name(f".{path.name}.{owner_tag()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="\n") as f:
            f.writelines(f"{digest}  {name}\n" for name, digest in sorted(listed.items()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def store_lock(store: Path) -> StoreLock:
    """The manifest's lock, in ``runs/.locks/`` (ignored by git; a killed holder leaves it)."""
    return StoreLock(store / RUNS / ".locks" / "RECORDS.lock")


def note_written(path: str | os.PathLike) -> None:
    """Put the record at ``path``, just written, into its store's manifest; nothing for any other
    file. The hash is of the file as it is now, so when two processes write one record, the
    second to get the lock lists what the file holds."""
    found = store_of(path)
    if found is None:
        return
    store, name = found
    with store_lock(store):
        listed = read_manifest(store)
        if listed is None:  # a store from before the manifest: adopted as it stands
            listed = {r: content_hash(store / r) for r in records(store)}
        listed[name] = content_hash(store / name)
        _write_manifest(store, {r: d for r, d in listed.items() if (store / r).is_file()})


def write_record(path: str | os.PathLike, record: Any) -> Path:
    """The store's one way to write a run record: ``atomic_write_json``, then its hash into the
    manifest (:func:`note_written`)."""
    written = atomic_write_json(path, record)
    note_written(written)
    return written


def adopt(store: str | os.PathLike) -> list[str]:
    """List the records the manifest lacks (creating it where the store has records but no
    manifest) and drop the entries of absent ones; returns those newly listed. For records the
    caller has checked: a listed record keeps its hash."""
    store = Path(store)
    with store_lock(store):
        before = read_manifest(store)
        listed = dict(before or {})
        present = records(store)
        added = [r for r in present if r not in listed]
        listed.update({r: content_hash(store / r) for r in added})
        kept = {r: d for r, d in listed.items() if (store / r).is_file()}
        if kept != before and (before is not None or kept):
            _write_manifest(store, kept)
    return added


def verify(store: str | os.PathLike) -> tuple[list[str], list[str]] | None:
    """(edited, unlisted): the records whose content differs from their listed hash, and those not
    listed; None when the store has no manifest (nothing to compare with)."""
    store = Path(store)
    listed = read_manifest(store)
    if listed is None:
        return None
    edited, unlisted = [], []
    for name in records(store):
        if name not in listed:
            unlisted.append(name)
        elif content_hash(store / name) != listed[name]:
            edited.append(name)
    return edited, unlisted
