"""The data folder and its files: where the local copies are (``PLUGIN_DATA_DIR``, by default the
repository's ``data/``, or ``hub`` for the Hugging Face Hub), what each file is, and readers that
turn each dataset's files into rows shaped like the Hub's, so that ``data.datasets`` converts
both sources the same way. Every local file is verified before it is read (``data.integrity``).
"""
from __future__ import annotations

import csv
import functools
import json
import os
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import sources
from .integrity import MissingDataError, verify_file, verify_folder

# The Hub's test split: every file of test/, sorted by name.
WEBNLG_TEST_FILES = ("testdata_no_lex.xml", "testdata_unseen_with_lex.xml",
                     "testdata_with_lex.xml")

# What each local file is, keyed by its path relative to the data folder (the downloads
# themselves: ``data.sources``; ``plugin-repro data fetch`` gets them).
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

# Each dataset's folder in the data folder: its loaded splits are kept while the files there stay the same.
DATASET_FOLDERS = {"e2e": "e2e_cleaned", "webnlg": "webnlg", "commongen": "commongen", "adidas": "adidas"}

HUB = "hub"  # PLUGIN_DATA_DIR=hub: read the Hugging Face Hub datasets instead of local files
REPO_DATA_DIR = Path(__file__).resolve().parents[2] / "data"


def reads_hub() -> bool:
    """``PLUGIN_DATA_DIR=hub`` (any case, spaces aside): the datasets come from the Hugging Face Hub."""
    return os.environ.get("PLUGIN_DATA_DIR", "").strip().lower() == HUB


def data_dir() -> Path | None:
    """The local data folder: ``PLUGIN_DATA_DIR``, by default the repository's ``data/``;
    None when ``PLUGIN_DATA_DIR=hub`` (the Hugging Face Hub)."""
    if reads_hub():
        return None
    value = os.environ.get("PLUGIN_DATA_DIR", "").strip()
    path = Path(value).expanduser() if value else REPO_DATA_DIR
    if not path.is_dir():
        if value:
            raise FileNotFoundError(
                f"PLUGIN_DATA_DIR={value!r} is not a directory. Point it at a folder laid out like "
                "data/ (e2e_cleaned/, webnlg/, commongen/, adidas/, nltk_data/; see data/README.md), "
                f"fill one with `plugin-repro data fetch --dest {value}`, or set "
                "PLUGIN_DATA_DIR=hub to read the datasets from the Hugging Face Hub."
            )
        raise MissingDataError(
            f"The default data folder {path} does not exist (plugin_lib installed outside its "
            "repository?). Set PLUGIN_DATA_DIR to a data folder (fill one with `plugin-repro data "
            "fetch --dest DIR`), or PLUGIN_DATA_DIR=hub to read the Hugging Face Hub.",
            "")
    return path


def describe_data_dir() -> str:
    """Where the data comes from, in words (for messages and logs)."""
    if reads_hub():
        return "the Hugging Face Hub (PLUGIN_DATA_DIR=hub)"
    value = os.environ.get("PLUGIN_DATA_DIR", "").strip()
    if value:
        return f"PLUGIN_DATA_DIR={value}"
    return f"the default data folder {REPO_DATA_DIR} (PLUGIN_DATA_DIR overrides it)"


def files_signature(name: str) -> tuple | None:
    """The local files dataset ``name`` is read from, as the data folder and every file in the
    dataset's folder with its size, modification time and inode: equal signatures, the same
    bytes as last read. None for the Hub, which has no local files to compare."""
    root = data_dir()
    if root is None:
        return None
    entries = []
    for parent, _, names in os.walk(root / DATASET_FOLDERS[name]):
        for file in names:
            try:
                stat = os.stat(os.path.join(parent, file))
            except FileNotFoundError:  # a temporary that a fetch removed meanwhile
                continue
            entries.append((os.path.join(parent, file), stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return str(root.resolve()), tuple(sorted(entries))


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
            "(fill it with `plugin-repro data fetch`; layout in data/README.md).", hub_name) from error


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


def webnlg_xml_rows(path: Path) -> tuple[dict[str, Any], ...]:
    """The entries of a WebNLG XML file as rows shaped like HF ``web_nlg`` rows (read-only: a
    process parses a file once for as long as its size and modification time stay the same;
    the judges and the fine-tuning pool load the splits hundreds of times)."""
    stat = Path(path).stat()
    return _parsed_webnlg_xml(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _parsed_webnlg_xml(path: str, size: int, mtime_ns: int) -> tuple[dict[str, Any], ...]:
    return tuple(_webnlg_entries(path))


def _webnlg_entries(path: str) -> Iterator[dict[str, Any]]:
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
                  "paper's) is missing.", stacklevel=5)
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
