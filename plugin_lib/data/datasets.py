"""The paper's four datasets as lists of :class:`Example`, one per unique input.

``load_dataset(name, split)`` applies the filters and splits of the authors' code (see
``shared/docs/REFERENCE.md``). It reads the local files of the data folder: the repository's
``data/`` (layout in ``data/README.md``; ``python -m plugin_lib.data.fetch`` fills it), or the
folder named by ``PLUGIN_DATA_DIR``. Every file is verified before it is read
(``data.integrity``: checksum, columns, rows), so a missing, truncated or malformed file stops
with one message naming it, never loads as a shorter dataset. ``PLUGIN_DATA_DIR=hub`` reads the
Hugging Face Hub datasets instead (e.g. on Colab), and Adidas from the CSV named by
``PLUGIN_ADIDAS_CSV``. Both sources go through the same row conversion, because the local
readers produce rows shaped like the Hub's.

Choices a user should know:

- References keep one entry per source row, in file order, so the number of (input, reference)
  pairs equals the paper's row counts. A reference can therefore repeat within an input (E2E has
  identical human references for the same MR; WebNLG entries listed twice, see below).
- E2E: the cleaned E2E; the source is the MR string as given. The train split is not in
  ``shared/data``; the paper uses it only for ablations.
- WebNLG (``webnlg_challenge_2017``): the reference is the first lexicalisation marked "good",
  as in the authors' code; every lexicalisation of the input (any comment) is kept in
  ``meta["all_lexicalisations"]``. Source: the modified triples, ``"s | p | o"`` joined with
  ``"; "``. Validation/test use, like the Hub's test split, all three test files in sorted
  order (``testdata_no_lex``, ``testdata_unseen_with_lex``, ``testdata_with_lex``) after the
  dev files: the authors shuffled these rows before dropping the ones without a reference, so
  the no-lex rows are needed to reproduce their split, which this does exactly. The
  unseen-category entries are in two of those files, so their inputs carry the same reference
  twice, as in the authors' data. Train: the Airport, Building, University and Monument entries
  with a "good" lexicalisation (the 2017 challenge has no MeanOfTransportation in train).
- CommonGen: the source is the concepts in alphabetical order joined with ", " (the Hub lists
  each concept set in a shuffled order; sorting makes local and Hub sources equal). Validation
  and test halve the official dev set like the authors, by the Hub's ``concept_set_idx`` (one
  per line of the dev file), which reproduces the paper's counts exactly. The dev file lists
  the set cut#hair#style on two lines; both fall into validation, where they form one input
  with all their references. Train: the
  paper's v1.1 training set if ``commongen/hf_format/commongen.train.jsonl`` exists, else the
  older v1.0 release with a warning; either way filtered to targets containing the word "man"
  (case-sensitive, as the authors did) and concepts without "man" or "woman".
- Adidas: source ``"name: ..., category: ..., selling_price: ..., color: ..."``; reference the
  description with line endings normalised to ``\\n``; the last 100 rows are the test set. A
  few inputs occur in both validation and test, as in the authors' row-based split.
- ``meta["rows"]``: per reference, the position of its row in the authors' row order of the
  split (file order; for WebNLG and CommonGen validation/test the order after their seed-42
  shuffle). The authors drew ICL demonstrations by row index (``data.prompts``).
"""
from __future__ import annotations

import csv
import json
import os
import re
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import sources
from .integrity import DataError, MissingDataError, verify_file, verify_folder

SPLITS = {
    "e2e": ("train", "validation", "test"),
    "webnlg": ("train", "validation", "test"),
    "commongen": ("train", "validation", "test"),
    "adidas": ("validation", "test"),
}
DATASETS = tuple(SPLITS)
ALL_SPLITS = ("train", "validation", "test")

WEBNLG_TRAIN_CATEGORIES = frozenset(
    {"Airport", "Building", "University", "Monument", "MeanOfTransportation"})
WEBNLG_EVAL_CATEGORIES = frozenset(
    {"Artist", "Politician", "Athlete", "ComicsCharacter", "Astronaut", "SportsTeam"})
# The Hub's test split: every file of test/, sorted by name.
WEBNLG_TEST_FILES = ("testdata_no_lex.xml", "testdata_unseen_with_lex.xml",
                     "testdata_with_lex.xml")
ADIDAS_FIELDS = ("name", "category", "selling_price", "color")
ADIDAS_TEST_ROWS = 100
SPLIT_SEED = 42  # the authors' seed for halving WebNLG and CommonGen into validation/test

# What each local file is, keyed by its path relative to the data folder (the downloads
# themselves: ``data.sources``; ``python -m plugin_lib.data.fetch`` gets them).
DOWNLOADS = {
    "e2e_cleaned/devel-fixed.no-ol.csv":
        "cleaned-data/devel-fixed.no-ol.csv of https://github.com/tuetschek/e2e-cleaning",
    "e2e_cleaned/test-fixed.csv":
        "cleaned-data/test-fixed.csv of https://github.com/tuetschek/e2e-cleaning",
    "e2e_cleaned/train-fixed.no-ol.csv":
        "cleaned-data/train-fixed.no-ol.csv of https://github.com/tuetschek/e2e-cleaning "
        "(about 12 MB; the paper uses the E2E train split only for ablations)",
    "webnlg/webnlg_challenge_2017":
        "the folder webnlg_challenge_2017/ (train/, dev/, test/) of "
        "https://gitlab.com/shimorina/webnlg-dataset",
    "commongen/hf_format/commongen.dev.jsonl":
        "commongen.dev.jsonl from the CommonGen data zip that HF common_gen is built from "
        f"({sources.COMMONGEN_ZIP})",
    "commongen/hf_format/commongen.train.jsonl":
        f"commongen.train.jsonl (v1.1, the paper's) from {sources.COMMONGEN_ZIP}, "
        "or the v1.0 files commongen.train.cs_str.txt and commongen.train.tgt.txt of "
        "https://github.com/INK-USC/CommonGen (dataset/final_data/commongen/) into "
        "commongen/v1.0_initial_release/",
    "commongen/v1.0_initial_release":
        "commongen.train.cs_str.txt and commongen.train.tgt.txt (the v1.0 training set) of "
        "https://github.com/INK-USC/CommonGen (dataset/final_data/commongen/)",
    "adidas/adidas_usa.csv":
        "adidas_usa.csv of the Kaggle dataset 'Adidas Fashion Retail Products Dataset' "
        f"(thedevastator, {sources.KAGGLE_PAGE})",
}

HUB = "hub"  # PLUGIN_DATA_DIR=hub: read the Hugging Face Hub datasets instead of local files
REPO_DATA_DIR = Path(__file__).resolve().parents[2] / "data"


def data_dir() -> Path | None:
    """The local data folder: ``PLUGIN_DATA_DIR``, by default the repository's ``data/``;
    None when ``PLUGIN_DATA_DIR=hub`` (the Hugging Face Hub)."""
    value = os.environ.get("PLUGIN_DATA_DIR", "").strip()
    if value.lower() == HUB:
        return None
    path = Path(value).expanduser() if value else REPO_DATA_DIR
    if not path.is_dir():
        if value:
            raise FileNotFoundError(
                f"PLUGIN_DATA_DIR={value!r} is not a directory. Point it at a folder laid out like "
                "data/ (e2e_cleaned/, webnlg/, commongen/, adidas/, nltk_data/; see data/README.md), "
                f"fill one with `python -m plugin_lib.data.fetch --dest {value}`, or set "
                "PLUGIN_DATA_DIR=hub to read the datasets from the Hugging Face Hub."
            )
        raise MissingDataError(
            f"The default data folder {path} does not exist (plugin_lib installed outside its "
            "repository?). Set PLUGIN_DATA_DIR to a data folder (fill one with `python -m "
            "plugin_lib.data.fetch --dest DIR`), or PLUGIN_DATA_DIR=hub to read the Hugging Face Hub.",
            "")
    return path


def describe_data_dir() -> str:
    """Where the data comes from, in words (for messages and logs)."""
    value = os.environ.get("PLUGIN_DATA_DIR", "").strip()
    if value.lower() == HUB:
        return "the Hugging Face Hub (PLUGIN_DATA_DIR=hub)"
    if value:
        return f"PLUGIN_DATA_DIR={value}"
    return f"the default data folder {REPO_DATA_DIR} (PLUGIN_DATA_DIR overrides it)"


def use_local_nltk_data() -> None:
    """Let NLTK find ``<data folder>/nltk_data`` (stopwords, punkt_tab) without NLTK_DATA."""
    try:
        folder = data_dir()
    except FileNotFoundError:
        return
    if folder is not None and (folder / "nltk_data").is_dir():
        import nltk

        if str(folder / "nltk_data") not in nltk.data.path:
            nltk.data.path.append(str(folder / "nltk_data"))


@dataclass(frozen=True)
class Example:
    """One unique input of a dataset split with all its references.

    ``id`` is ``<dataset>-<split>-<index>`` (stable: indices are taken before subsetting);
    ``source`` fills the prompt's slot; ``meta`` holds ``dataset``, ``split`` and per-dataset
    details (WebNLG category and lexicalisations, CommonGen concepts, Adidas attributes).
    """

    id: str
    source: str
    references: tuple[str, ...]
    meta: dict = field(default_factory=dict, hash=False)


# ---------------------------------------------------------------------------------------------
# Formatting of the source that fills the prompt's slot: one function per dataset.

def format_e2e(mr: str) -> str:
    """The MR as given, e.g. ``name[Aromi], eatType[pub]``."""
    return mr.strip()


def format_webnlg(triples: Iterable[str]) -> str:
    """Triples ``subject | property | object`` joined with ``; ``."""
    return "; ".join(t.strip() for t in triples)


def format_commongen(concepts: Iterable[str]) -> str:
    """Concepts in alphabetical order joined with ``, ``."""
    return ", ".join(sorted(c.strip() for c in concepts))


def format_adidas(row: Mapping[str, str]) -> str:
    """``name: ..., category: ..., selling_price: ..., color: ...``."""
    return ", ".join(f"{key}: {str(row[key]).strip()}" for key in ADIDAS_FIELDS)


# The inverses, for prompts that lay the source out otherwise (``data.prompts``, authors' style).

def webnlg_triples(source: str) -> list[str]:
    """The triples of a WebNLG source. A ``"; "`` inside an object (a few quoted lists of
    former names) stays in its triple: a new triple starts only where a piece has two `` | ``."""
    triples: list[str] = []
    for piece in source.split("; "):
        if triples and piece.count(" | ") < 2:
            triples[-1] += "; " + piece
        else:
            triples.append(piece)
    return triples


_ADIDAS_SOURCE = re.compile(", ".join(f"{key}: (.*)" for key in ADIDAS_FIELDS), re.S)


def adidas_attributes(source: str) -> dict[str, str]:
    """The fields of an Adidas source, ``{"name": ..., "category": ..., ...}``."""
    match = _ADIDAS_SOURCE.fullmatch(source)
    if match is None:
        raise ValueError(f"Not an Adidas source ({', '.join(f'{k}: ...' for k in ADIDAS_FIELDS)}): {source!r}.")
    return dict(zip(ADIDAS_FIELDS, match.groups()))


# ---------------------------------------------------------------------------------------------
# Conversion of Hub-shaped rows to (source, reference, meta) records, and grouping.

Record = tuple[str, str, dict]


def e2e_records(rows: Iterable[Mapping[str, Any]]) -> Iterator[Record]:
    """Records of ``e2e_nlg_cleaned`` rows (``meaning_representation``, ``human_reference``)."""
    for row in rows:
        yield format_e2e(row["meaning_representation"]), row["human_reference"], {}


def webnlg_first_good(row: Mapping[str, Any]) -> str | None:
    """The first lexicalisation marked "good" of a ``web_nlg`` row, or None."""
    lex = row["lex"]
    return next((text for comment, text in zip(lex["comment"], lex["text"])
                 if comment == "good"), None)


def webnlg_source(row: Mapping[str, Any]) -> str:
    """The formatted (first) modified triple set of a ``web_nlg`` row."""
    return format_webnlg(row["modified_triple_sets"]["mtriple_set"][0])


def webnlg_has_reference(row: Mapping[str, Any]) -> bool:
    """Whether a ``web_nlg`` row has a non-empty "good" lexicalisation (rows without are dropped)."""
    reference = webnlg_first_good(row)
    return bool(reference and reference.strip())


def webnlg_records(rows: Iterable[Mapping[str, Any]]) -> Iterator[Record]:
    """Records of ``web_nlg`` rows that have a non-empty "good" lexicalisation."""
    rows = list(rows)
    all_lex: dict[str, dict[str, None]] = {}  # dict as an ordered set
    for row in rows:
        all_lex.setdefault(webnlg_source(row), {}).update(dict.fromkeys(row["lex"]["text"]))
    for row in filter(webnlg_has_reference, rows):
        source = webnlg_source(row)
        yield source, webnlg_first_good(row), {"category": row["category"],
                                               "all_lexicalisations": tuple(all_lex[source])}


def commongen_records(rows: Iterable[Mapping[str, Any]]) -> Iterator[Record]:
    """Records of ``common_gen`` rows (``concepts``, ``target``)."""
    for row in rows:
        concepts = tuple(sorted(row["concepts"]))
        yield format_commongen(concepts), row["target"], {"concepts": concepts}


def is_commongen_man_row(row: Mapping[str, Any]) -> bool:
    """The authors' train filter: the target says "man", the concepts name neither sex."""
    return (re.search(r"\bman\b", row["target"]) is not None
            and not {"man", "woman"} & set(row["concepts"]))


def adidas_records(rows: Iterable[Mapping[str, str]]) -> Iterator[Record]:
    """Records of Adidas CSV rows: the product attributes and their description."""
    for row in rows:
        description = row["description"].replace("\r\n", "\n").replace("\r", "\n").strip()
        yield format_adidas(row), description, {key: row[key] for key in ADIDAS_FIELDS}


def group_by_source(name: str, split: str, records: Iterable[Record],
                    positions: Iterable[int] | None = None) -> list[Example]:
    """One Example per source, in order of first appearance; meta from its first record.

    ``positions``: each record's row position in the authors' order of the split (default:
    the records' own order), kept per reference as ``meta["rows"]``.
    """
    records = list(records)
    positions = list(range(len(records)) if positions is None else positions)
    if len(positions) != len(records):
        raise ValueError(f"{name} {split}: {len(positions)} row positions for {len(records)} records.")
    groups: dict[str, tuple[list[str], list[int], dict]] = {}
    for (source, reference, meta), position in zip(records, positions):
        refs, rows, _ = groups.setdefault(source, ([], [], meta))
        refs.append(reference)
        rows.append(position)
    return [
        Example(id=f"{name}-{split}-{i:05d}", source=source, references=tuple(refs),
                meta={"dataset": name, "split": split, **meta, "rows": tuple(rows)})
        for i, (source, (refs, rows, meta)) in enumerate(groups.items())
    ]


def first_half_inputs(keys: list[Hashable], seed: int = SPLIT_SEED) -> set[Hashable]:
    """The input keys the authors put into validation when halving dev data by input.

    They shuffled the rows with ``DataFrame.sample(frac=1, random_state=seed)`` (the same
    permutation as ``RandomState(seed).permutation``), listed the unique inputs in shuffled
    order and gave the first ``n // 2`` to validation, the rest to test. ``keys`` holds the
    input key of every row.
    """
    order = np.random.RandomState(seed).permutation(len(keys))
    unique = list(dict.fromkeys(keys[i] for i in order))
    return set(unique[: len(unique) // 2])


def shuffled_positions(n: int, seed: int = SPLIT_SEED) -> list[int]:
    """Each of ``n`` rows' position after the authors' shuffle (:func:`first_half_inputs`)."""
    positions = np.empty(n, dtype=int)
    positions[np.random.RandomState(seed).permutation(n)] = np.arange(n)
    return positions.tolist()


# ---------------------------------------------------------------------------------------------
# Readers: Hub-shaped rows from the local files or from the Hub.

def missing_data_error(relpath: str) -> MissingDataError:
    """The error for a missing local file: what it is and how to get it."""
    what = next((text for key, text in DOWNLOADS.items() if relpath.startswith(key)), relpath)
    return MissingDataError(
        f"Missing data file {data_dir() / relpath} (data from {describe_data_dir()}). It is {what}. "
        f"{sources.how_to_get(relpath, data_dir())} Or set PLUGIN_DATA_DIR=hub to read the datasets from the "
        "Hugging Face Hub.", relpath)


def local_path(relpath: str) -> Path:
    """``relpath`` under the data dir, verified (``data.integrity``); MissingDataError saying
    what to download when it is not there, DataError when it is damaged."""
    path = data_dir() / relpath
    if not path.exists():
        raise missing_data_error(relpath)
    if path.is_dir():
        verify_folder(data_dir(), relpath)
        return path
    return verify_file(data_dir(), relpath)


def hub_rows(hub_name: str, split: str, config_name: str | None = None):
    """Rows of a Hugging Face Hub dataset split (needs network access)."""
    import datasets

    try:
        return datasets.load_dataset(hub_name, config_name, split=split)
    except ConnectionError as error:
        raise MissingDataError(
            f"PLUGIN_DATA_DIR=hub, and the Hugging Face Hub dataset '{hub_name}' cannot be reached. "
            "Connect to the internet, or unset PLUGIN_DATA_DIR to read the local data folder "
            "(fill it with `python -m plugin_lib.data.fetch`; layout in data/README.md).", hub_name) from error


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    # csv with newline="" keeps the newlines embedded in quoted fields.
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def e2e_rows(split: str):
    """``e2e_nlg_cleaned`` rows of a split, from the local CSVs or the Hub."""
    if data_dir() is None:
        return hub_rows("e2e_nlg_cleaned", split)
    filename = {"train": "train-fixed.no-ol.csv", "validation": "devel-fixed.no-ol.csv",
                "test": "test-fixed.csv"}[split]
    return [{"meaning_representation": row["mr"], "human_reference": row["ref"]}
            for row in read_csv_rows(local_path(f"e2e_cleaned/{filename}"))]


def webnlg_xml_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The entries of a WebNLG XML file as rows shaped like HF ``web_nlg`` rows."""
    for entry in ET.parse(path).getroot().iter("entry"):
        lexes = entry.findall("lex")
        yield {
            "category": entry.get("category"),
            "modified_triple_sets": {"mtriple_set": [
                [t.text.strip() for t in ts.findall("mtriple")]
                for ts in entry.findall("modifiedtripleset")]},
            "lex": {"comment": [lex.get("comment", "") for lex in lexes],
                    "text": [(lex.text or "").strip() for lex in lexes]},
        }


def webnlg_local_files(hub_split: str) -> list[Path]:
    """The XML files of a ``webnlg_challenge_2017`` split in the Hub builder's order."""
    base = "webnlg/webnlg_challenge_2017"
    if hub_split == "test":
        return [local_path(f"{base}/test/{name}") for name in WEBNLG_TEST_FILES]
    folder = local_path(f"{base}/{hub_split}")
    return [f for size in range(1, 8) for f in sorted(folder.glob(f"{size}triples/*.xml"))]


def webnlg_rows(hub_split: str):
    """``web_nlg`` (``webnlg_challenge_2017``) rows of a Hub split: train, dev or test."""
    if data_dir() is None:
        return hub_rows("web_nlg", hub_split, "webnlg_challenge_2017")
    return [row for path in webnlg_local_files(hub_split) for row in webnlg_xml_rows(path)]


def commongen_jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Rows shaped like HF ``common_gen`` rows, one per reference scene."""
    with open(path, encoding="utf-8") as f:
        for index, line in enumerate(f):
            item = json.loads(line.replace(", }", "}"))  # a known glitch, fixed as HF does
            concepts = item["concept_set"].split("#")
            for scene in item["scene"]:
                yield {"concept_set_idx": index, "concepts": concepts, "target": scene}


def commongen_v1_train_rows() -> Iterator[dict[str, Any]]:
    """Rows of the v1.0 training set; concepts lose their POS tags (``field_N`` -> ``field``)."""
    folder = "commongen/v1.0_initial_release"
    with open(local_path(f"{folder}/commongen.train.cs_str.txt"), encoding="utf-8") as cs, \
            open(local_path(f"{folder}/commongen.train.tgt.txt"), encoding="utf-8") as tgt:
        for concept_set, target in zip(cs, tgt):
            concepts = [c.rsplit("_", 1)[0] for c in concept_set.strip().split("#")]
            yield {"concepts": concepts, "target": target.strip()}


def commongen_rows(split: str):
    """``common_gen`` rows of the train or validation (official dev) split."""
    if data_dir() is None:
        return hub_rows("common_gen", split)
    if split == "validation":
        return commongen_jsonl_rows(local_path("commongen/hf_format/commongen.dev.jsonl"))
    v11 = "commongen/hf_format/commongen.train.jsonl"
    if (data_dir() / v11).exists():
        return commongen_jsonl_rows(local_path(v11))
    if not (data_dir() / "commongen/v1.0_initial_release").is_dir():
        raise missing_data_error(v11)
    warnings.warn(f"CommonGen train: the older v1.0 release is used, since {v11} (v1.1, the "
                  "paper's) is missing.", stacklevel=4)
    return commongen_v1_train_rows()


def adidas_rows() -> list[dict[str, str]]:
    """All rows of the Adidas CSV, in file order."""
    if data_dir() is not None:
        return read_csv_rows(local_path("adidas/adidas_usa.csv"))
    path = os.environ.get("PLUGIN_ADIDAS_CSV")
    if not path or not Path(path).is_file():
        raise MissingDataError(
            "The Adidas dataset is not on the Hugging Face Hub. Download "
            f"{DOWNLOADS['adidas/adidas_usa.csv']} and set PLUGIN_ADIDAS_CSV to its path "
            f"(now: {path!r}), or unset PLUGIN_DATA_DIR to read adidas/adidas_usa.csv from the "
            "local data folder.", "adidas/adidas_usa.csv")
    return read_csv_rows(verify_file(None, "adidas/adidas_usa.csv", Path(path)))


# ---------------------------------------------------------------------------------------------
# Per-dataset loaders: the paper's filters and splits.

def load_e2e(split: str) -> list[Example]:
    return group_by_source("e2e", split, e2e_records(e2e_rows(split)))


def load_webnlg(split: str) -> list[Example]:
    if split == "train":
        rows = (r for r in webnlg_rows("train") if r["category"] in WEBNLG_TRAIN_CATEGORIES)
        return group_by_source("webnlg", split, webnlg_records(rows))
    rows = [r for hub_split in ("dev", "test") for r in webnlg_rows(hub_split)
            if r["category"] in WEBNLG_EVAL_CATEGORIES]
    # Halve before dropping rows without a reference, as the authors did.
    validation = first_half_inputs([webnlg_source(r) for r in rows])
    kept = [(position, r) for position, r in zip(shuffled_positions(len(rows)), rows)
            if (webnlg_source(r) in validation) == (split == "validation")]
    return group_by_source("webnlg", split, webnlg_records(r for _, r in kept),
                           positions=[position for position, r in kept if webnlg_has_reference(r)])


def load_commongen(split: str) -> list[Example]:
    if split == "train":
        rows = (r for r in commongen_rows("train") if is_commongen_man_row(r))
        return group_by_source("commongen", split, commongen_records(rows))
    rows = list(commongen_rows("validation"))
    # Halved by the Hub's concept-set index, as the authors' inputs were distinct per index.
    validation = first_half_inputs([r["concept_set_idx"] for r in rows])
    kept = [(position, r) for position, r in zip(shuffled_positions(len(rows)), rows)
            if (r["concept_set_idx"] in validation) == (split == "validation")]
    return group_by_source("commongen", split, commongen_records(r for _, r in kept),
                           positions=[position for position, _ in kept])


def load_adidas(split: str) -> list[Example]:
    rows = adidas_rows()
    cut = len(rows) - ADIDAS_TEST_ROWS
    rows = rows[cut:] if split == "test" else rows[:cut]
    return group_by_source("adidas", split, adidas_records(rows))


LOADERS = {"e2e": load_e2e, "webnlg": load_webnlg, "commongen": load_commongen,
           "adidas": load_adidas}


def check_name_and_split(name: str, split: str) -> None:
    """ValueError listing the valid names for an unknown dataset or split."""
    if name not in SPLITS:
        raise ValueError(f"Unknown dataset {name!r}. Choose one of: {', '.join(DATASETS)}.")
    if split not in SPLITS[name]:
        raise ValueError(
            f"Unknown split {split!r} for {name!r}. Choose one of: {', '.join(SPLITS[name])}.")


def subset(examples: list[Example], rows: int | None, seed: int) -> list[Example]:
    """A seeded subset of ``rows`` unique inputs, in their original order."""
    if rows is None or rows >= len(examples):
        return list(examples)
    if rows < 0:
        raise ValueError(f"rows must be >= 0 or None, got {rows}.")
    keep = np.sort(np.random.RandomState(seed).permutation(len(examples))[:rows])
    return [examples[i] for i in keep]


def load_dataset(name: str, split: str, *, rows: int | None = None,
                 seed: int = 42) -> list[Example]:
    """The unique inputs of a dataset split; ``rows`` keeps a seeded subset of them."""
    check_name_and_split(name, split)
    return subset(LOADERS[name](split), rows, seed)


# ---------------------------------------------------------------------------------------------
# Helpers for training and statistics.

def split_hyper_validation(examples: list[Example], frac: float = 0.4,
                           seed: int = 0) -> tuple[list[Example], list[Example]]:
    """(train part, hyper-validation part) of examples, divided by unique input.

    Both parts keep the input order; with two or more examples neither part is empty.
    """
    if not 0 < frac < 1:
        raise ValueError(f"frac must be between 0 and 1, got {frac}.")
    n = len(examples)
    n_hyper = min(max(round(n * frac), 1), n - 1) if n > 1 else 0
    hyper = set(np.random.RandomState(seed).permutation(n)[:n_hyper].tolist())
    return ([e for i, e in enumerate(examples) if i not in hyper],
            [e for i, e in enumerate(examples) if i in hyper])


def training_pairs(examples: Iterable[Example]) -> list[tuple[Example, str]]:
    """One (example, reference) pair per reference: the unit the models train on."""
    return [(example, reference) for example in examples for reference in example.references]
