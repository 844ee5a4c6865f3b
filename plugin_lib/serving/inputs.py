"""What the commands accept, checked before any model is loaded: (prompt, completion) pair files,
prompt files, the prompt-length limit, a base that is an endpoint. Imports nothing heavy, so
refused input answers in well under a second (``plugin-repro``'s commands import torch only when they run).
"""
from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "plugin_config.json"  # what makes a directory a Plugin artifact
MAX_PROMPT_TOKENS = 2048  # the longest prompt generate, evaluate and serve accept unless told otherwise

COLUMNS = ("prompt", "completion")
MIN_PROMPTS = 2


def is_endpoint(base: str) -> bool:
    """Whether ``--base`` is an OpenAI-compatible server's URL rather than a model's name."""
    return base.startswith(("http://", "https://"))


class DataFileError(ValueError):
    """A training file that cannot be used as it is."""


@dataclass(frozen=True)
class Pair:
    prompt: str
    completion: str


def read_pairs(path: str | Path) -> list[Pair]:
    """The (prompt, completion) pairs of a JSONL or CSV file, with an error that names the line
    and what to do for a missing file, an empty one, a missing column or a non-text value."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such file. Pass a JSONL or CSV file of {' and '.join(COLUMNS)} columns.")
    try:
        return _read_pairs(path)
    except UnicodeDecodeError as err:
        raise DataFileError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}). Save it as UTF-8.") from None


def _read_pairs(path: Path) -> list[Pair]:
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if reader.fieldnames and missing:
                raise DataFileError(f"{path}: no column {', '.join(map(repr, missing))} (columns: {reader.fieldnames}). "
                                    f"The file needs the columns {COLUMNS}.")
            rows = [(i + 2, row) for i, row in enumerate(reader)]
    elif path.suffix.lower() in (".jsonl", ".json"):
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFileError(f"{path}:{number}: not a JSON object ({err.msg}). JSONL has one object per line.") from None
            if not isinstance(row, dict):
                raise DataFileError(f"{path}:{number}: a {type(row).__name__}, not an object with {COLUMNS}.")
            rows.append((number, row))
    else:
        raise DataFileError(f"{path}: unknown file type {path.suffix!r}; use .jsonl or .csv.")
    if not rows:
        raise DataFileError(f"{path} is empty: it needs (prompt, completion) pairs, one per line.")
    pairs = []
    for number, row in rows:
        for column in COLUMNS:
            value = row.get(column)
            if not isinstance(value, str) or not value.strip():
                what = "missing" if value is None else f"not a non-empty string ({value!r:.40})"
                raise DataFileError(f"{path}:{number}: {column!r} is {what}. Every pair needs both {COLUMNS}.")
        pairs.append(Pair(row["prompt"], row["completion"]))
    if len({p.prompt for p in pairs}) < MIN_PROMPTS:
        raise DataFileError(f"{path}: {len(pairs)} pairs but fewer than {MIN_PROMPTS} distinct prompts: the "
                            "hyper-validation part needs prompts of its own.")
    return pairs


def data_sha256(pairs: list[Pair]) -> str:
    """A hash of the pairs themselves (not of the file's formatting)."""
    digest = hashlib.sha256()
    for pair in pairs:
        digest.update(json.dumps([pair.prompt, pair.completion]).encode())
    return digest.hexdigest()


def read_prompts(path: Path) -> list[str]:
    """Prompts of ``path``: a text file (one per line) or JSONL with a ``prompt`` field; an error
    names the file and the line."""
    if not path.is_file():
        raise DataFileError(f"{path}: no such file. Pass a text file (one prompt per line) or JSONL with a prompt field.")
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as err:
        raise DataFileError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}). Save it as UTF-8.") from None
    if not lines:
        raise DataFileError(f"{path} is empty: one prompt per line, or JSONL with a prompt field.")
    if path.suffix.lower() != ".jsonl":
        return lines
    prompts = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataFileError(f"{path}:{number}: not a JSON object ({err.msg}). JSONL has one object per line; "
                                "a plain text file takes one prompt per line.") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise DataFileError(f"{path}:{number}: no prompt field (a string).")
        prompts.append(row["prompt"])
    return prompts
