"""Data checked at the door: every local file is verified before a loader reads it.

A file is accepted when it has the columns the loader reads (CSV) and its SHA-256 is the known
one (``checksums.txt``: the reference copies the committed results were made on). A CSV whose
bytes differ but whose parsed rows are the same (other line endings, as some copies of the
Adidas file have) is accepted too. A file without a known checksum (the optional E2E train and
CommonGen v1.1 train files) must have the expected number of rows. Anything else raises one
clear error naming the file, what is wrong and how to get it again; a truncated file never
loads as a shorter dataset. Results are cached per process (keyed on path, size and mtime), so
a file is hashed once however often it is loaded.

``check(root, groups)`` runs every check of the named groups at once and returns the problems;
``plugin-repro data check`` prints them.
"""
from __future__ import annotations

import csv
import functools
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import sources

CHECKSUMS_FILE = Path(__file__).with_name("checksums.txt")

E2E_COLUMNS = ("mr", "ref")
# The product attributes the source is built from, then the reference (datasets.ADIDAS_FIELDS).
ADIDAS_COLUMNS = ("name", "category", "selling_price", "color", "description")


class MissingDataError(FileNotFoundError):
    """A local data file is missing; ``relpath`` is its path relative to the data folder."""

    def __init__(self, message: str, relpath: str):
        super().__init__(message)
        self.relpath = relpath


class DataError(ValueError):
    """A local data file is there but is not what the loaders read: truncated, modified, or
    without a column they need. ``relpath`` as in :class:`MissingDataError`."""

    def __init__(self, message: str, relpath: str):
        super().__init__(message)
        self.relpath = relpath


@dataclass(frozen=True)
class FileSpec:
    """What a file must look like. ``rows``: data rows of a CSV, lines of a text or JSONL
    file. ``rows_digest``: a CSV's :func:`csv_rows_digest`, which accepts other line endings."""

    kind: str  # "csv", "lines" or "other"
    columns: tuple[str, ...] = ()
    rows: int | None = None
    rows_digest: str | None = None


SPECS = {
    "e2e_cleaned/devel-fixed.no-ol.csv": FileSpec(
        "csv", E2E_COLUMNS, 4_299, "55cff4336058e0b9fccde178a2dca3c22d14e6846fed9549d7c058f08cfe3201"),
    "e2e_cleaned/test-fixed.csv": FileSpec(
        "csv", E2E_COLUMNS, 4_693, "a772f4c2883e6a4ac1507af01862fa9ef648952c5938fff73a477db821781227"),
    "e2e_cleaned/train-fixed.no-ol.csv": FileSpec("csv", E2E_COLUMNS, 33_525),
    "adidas/adidas_usa.csv": FileSpec(
        "csv", ADIDAS_COLUMNS, 845, "bbfe69d9fff133cddf66e21fa80892fc3217f6b959d8b99f57cb71d78a99371f"),
    "commongen/hf_format/commongen.dev.jsonl": FileSpec("lines", rows=993),
    "commongen/hf_format/commongen.train.jsonl": FileSpec("lines", rows=32_651),
    "commongen/v1.0_initial_release/commongen.train.cs_str.txt": FileSpec("lines", rows=39_069),
    "commongen/v1.0_initial_release/commongen.train.tgt.txt": FileSpec("lines", rows=39_069),
}

# Files a group needs (more are added from checksums.txt: every WebNLG file). The optional
# ones are checked when present; CommonGen needs the v1.0 train files only without v1.1.
REQUIRED = {
    "e2e": ("e2e_cleaned/devel-fixed.no-ol.csv", "e2e_cleaned/test-fixed.csv"),
    "commongen": ("commongen/hf_format/commongen.dev.jsonl",),
    "adidas": ("adidas/adidas_usa.csv",),
    "nltk": ("nltk_data/corpora/stopwords/english",),
}
OPTIONAL = {
    "e2e": ("e2e_cleaned/train-fixed.no-ol.csv",),
    "commongen": ("commongen/hf_format/commongen.train.jsonl",),
}
COMMONGEN_V10_TRAIN = ("commongen/v1.0_initial_release/commongen.train.cs_str.txt",
                       "commongen/v1.0_initial_release/commongen.train.tgt.txt")
WEBNLG_FOLDER = "webnlg/webnlg_challenge_2017"
PUNKT_TAB = "nltk_data/tokenizers/punkt_tab/english"

_verified: set[tuple] = set()


@functools.lru_cache(maxsize=1)
def known_checksums() -> dict[str, str]:
    """{relative path: SHA-256} of the reference data (``sha256sum`` format)."""
    sums = {}
    for line in CHECKSUMS_FILE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            digest, relpath = line.split(maxsplit=1)
            sums[relpath.strip().lstrip("*")] = digest
    return sums


def webnlg_files() -> list[str]:
    """Every WebNLG file the loaders read (train, dev, test of ``webnlg_challenge_2017``)."""
    return sorted(p for p in known_checksums() if p.startswith(WEBNLG_FOLDER + "/"))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _csv_rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def csv_rows_digest(rows: list[list[str]]) -> str:
    """SHA-256 of a CSV's parsed rows (header included) with line endings inside fields as
    ``\\n``: the same for copies that differ only in line endings."""
    normal = [[c.replace("\r\n", "\n").replace("\r", "\n") for c in row] for row in rows]
    return hashlib.sha256(json.dumps(normal, ensure_ascii=False).encode("utf-8")).hexdigest()


def csv_header(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), [])


def _shown(path: Path) -> str:
    return str(path)


def _count(n: int) -> str:
    return f"{n:,}"


def verify_file(root: Path | None, relpath: str, path: Path | None = None) -> Path:
    """Check the file ``relpath`` of the data folder ``root`` (or at ``path``); returns its path.

    Raises MissingDataError when it is not there and DataError when it is wrong.
    """
    path = Path(path) if path is not None else Path(root) / relpath
    if not path.is_file():
        raise MissingDataError(f"Missing data file {_shown(path)}. {sources.how_to_get(relpath, root)}", relpath)
    stat = path.stat()
    key = (str(path.resolve()), relpath, stat.st_size, stat.st_mtime_ns)
    if key in _verified:
        return path
    spec = SPECS.get(relpath, FileSpec("other"))
    again = sources.how_to_get(relpath, root)
    try:
        if spec.kind == "csv":
            header = csv_header(path)
            missing = [c for c in spec.columns if c not in header]
            if missing:
                raise DataError(
                    f"Data file {_shown(path)} has no column{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(repr(c) for c in missing)}, which the loader reads (its header: "
                    f"{','.join(header) or 'empty'}; expected columns include {','.join(spec.columns)}). "
                    f"It is not the expected file. {again}", relpath)
        expected = known_checksums().get(relpath)
        if expected is not None:
            if sha256_file(path) != expected and not _same_rows(path, spec):
                raise DataError(
                    f"Data file {_shown(path)} is truncated or modified: its SHA-256 is not the known "
                    f"one (plugin_lib/data/checksums.txt){_rows_note(path, spec)}. Nothing was loaded "
                    f"from it. {again}", relpath)
        elif spec.rows is not None:
            problem = _rows_problem(path, spec)
            if problem:
                raise DataError(f"Data file {_shown(path)} is incomplete: {problem}. Nothing was loaded "
                                f"from it. {again}", relpath)
    except UnicodeDecodeError as err:
        raise DataError(f"Data file {_shown(path)} is not UTF-8 text ({err.reason} at byte {err.start}): "
                        f"it is damaged or not the expected file. {again}", relpath) from err
    _verified.add(key)
    return path


def _same_rows(path: Path, spec: FileSpec) -> bool:
    return spec.kind == "csv" and spec.rows_digest is not None and csv_rows_digest(_csv_rows(path)) == spec.rows_digest


def _row_count(path: Path, spec: FileSpec) -> int:
    if spec.kind == "csv":
        return max(len(_csv_rows(path)) - 1, 0)
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def _rows_note(path: Path, spec: FileSpec) -> str:
    if spec.rows is None or spec.kind == "other":
        return ""
    n = _row_count(path, spec)
    unit = "rows" if spec.kind == "csv" else "lines"
    if n == spec.rows:
        return f" (it has the expected {_count(n)} {unit}, but other content)"
    return f", and it has {_count(n)} {unit} where {_count(spec.rows)} are expected"


def _rows_problem(path: Path, spec: FileSpec) -> str | None:
    """Why a file without a known checksum is incomplete, or None."""
    if spec.kind == "csv":
        rows = _csv_rows(path)
        width = len(rows[0]) if rows else 0
        short = next((i for i, row in enumerate(rows[1:], start=2) if len(row) != width), None)
        if short is not None:
            return f"row {short} has {len(rows[short - 1])} fields where the header has {width} (cut mid-row?)"
        n, unit = max(len(rows) - 1, 0), "rows"
    else:
        n, unit = _row_count(path, spec), "lines"
    if n != spec.rows:
        return f"it has {_count(n)} {unit} where {_count(spec.rows)} are expected"
    return None


def verify_folder(root: Path, folder: str) -> list[Path]:
    """The known files under ``folder`` (each checked), in sorted order. An XML file there that
    is not known is an error too: the WebNLG loader reads every XML file of a split folder."""
    prefix = folder.rstrip("/") + "/"
    paths = [verify_file(root, relpath) for relpath in sorted(known_checksums()) if relpath.startswith(prefix)]
    refuse_unknown_files(root, folder)
    return paths


def refuse_unknown_files(root: Path, folder: str) -> None:
    """DataError for an XML file under ``folder`` that is not in checksums.txt."""
    known = known_checksums()
    base = Path(root) / folder
    extra = sorted(rel for rel in (p.relative_to(root).as_posix() for p in base.rglob("*.xml")) if rel not in known)
    if extra:
        raise DataError(
            f"Unexpected file {Path(root) / extra[0]}"
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            + f" in {base}: the loader reads every XML file there, and this one is not part of the "
            "dataset. Move it out of the data folder.", extra[0])


@dataclass(frozen=True)
class Problem:
    relpath: str
    message: str


def _try(root: Path, relpaths: Iterable[str], problems: list[Problem]) -> None:
    for relpath in relpaths:
        try:
            verify_file(root, relpath)
        except (MissingDataError, DataError) as err:
            problems.append(Problem(err.relpath, str(err)))


def check(root: Path, groups: Iterable[str] = sources.GROUPS) -> tuple[list[Problem], list[str]]:
    """(problems, notes) of the data folder for the named groups; no problems means every file
    the loaders read for them is there and complete. Notes name the optional files absent."""
    root = Path(root)
    problems: list[Problem] = []
    notes: list[str] = []
    for group in groups:
        if group not in sources.GROUPS:
            raise ValueError(f"Unknown data group {group!r}; choose from {', '.join(sources.GROUPS)}.")
        _try(root, REQUIRED.get(group, ()), problems)
        for relpath in OPTIONAL.get(group, ()):
            if (root / relpath).exists():
                _try(root, [relpath], problems)
            else:
                notes.append(f"optional {relpath} is absent ({sources.how_to_get(relpath)})")
        if group == "commongen" and not (root / OPTIONAL["commongen"][0]).exists():
            _try(root, COMMONGEN_V10_TRAIN, problems)
        if group == "webnlg":
            found: list[Problem] = []
            _try(root, webnlg_files(), found)
            missing = [p for p in found if not (root / p.relpath).exists()]
            if len(missing) > 3:  # one line for a folder that is missing, not one per file
                found = [p for p in found if p not in missing]
                found.insert(0, Problem(WEBNLG_FOLDER, (
                    f"Missing {len(missing)} of the {len(webnlg_files())} WebNLG files under "
                    f"{root / WEBNLG_FOLDER}, e.g. {missing[0].relpath}. {sources.how_to_get(WEBNLG_FOLDER)}")))
            problems += found
            if (root / WEBNLG_FOLDER).is_dir():
                try:
                    refuse_unknown_files(root, WEBNLG_FOLDER)
                except DataError as err:
                    problems.append(Problem(err.relpath, str(err)))
        if group == "nltk" and not (root / PUNKT_TAB).is_dir():
            problems.append(Problem(PUNKT_TAB, f"Missing NLTK's punkt_tab tokenizer ({root / PUNKT_TAB}). "
                                               f"{sources.how_to_get(PUNKT_TAB)}"))
    return problems, notes
