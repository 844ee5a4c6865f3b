"""The paper's four datasets (``datasets``) and its prompts (``prompts``); where the data files
are and how they are read (``files``), where they come from (``sources``,
``plugin-repro data fetch``) and how they are checked
(``integrity``, ``plugin-repro data check``).

The datasets' names load on first use: ``datasets`` imports numpy, and ``plugin-repro data
fetch|check`` (the files and their checks alone) answer ``--help`` without it.
"""
import importlib

from .files import DOWNLOADS, HUB, data_dir, describe_data_dir, use_local_nltk_data
from .integrity import DataError, MissingDataError

_FROM_DATASETS = ("ADIDAS_FIELDS", "ADIDAS_TEST_ROWS", "ALL_SPLITS", "DATASETS", "SPLIT_SEED", "SPLITS", "Example",
                  "load_dataset", "loader_warnings", "split_hyper_validation", "subset", "training_pairs")

__all__ = [
    "ADIDAS_FIELDS", "ADIDAS_TEST_ROWS", "ALL_SPLITS", "DATASETS", "DOWNLOADS", "HUB", "SPLIT_SEED", "SPLITS",
    "DataError", "Example", "MissingDataError", "data_dir", "describe_data_dir", "load_dataset", "loader_warnings",
    "split_hyper_validation", "subset", "training_pairs",
    "use_local_nltk_data",
]


def __getattr__(name: str):
    if name not in _FROM_DATASETS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".datasets", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
