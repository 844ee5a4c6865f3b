"""The paper's four datasets (``datasets``) and its prompts (``prompts``); where the data files
are and how they are read (``files``), where they come from (``sources``,
``python -m plugin_lib.data.fetch``) and how they are checked
(``integrity``, ``python -m plugin_lib.data.check``)."""
from .datasets import (
    ADIDAS_FIELDS,
    ADIDAS_TEST_ROWS,
    ALL_SPLITS,
    DATASETS,
    SPLIT_SEED,
    SPLITS,
    Example,
    load_dataset,
    split_hyper_validation,
    subset,
    training_pairs,
)
from .files import DOWNLOADS, HUB, data_dir, describe_data_dir, use_local_nltk_data
from .integrity import DataError, MissingDataError

__all__ = [
    "ADIDAS_FIELDS", "ADIDAS_TEST_ROWS", "ALL_SPLITS", "DATASETS", "DOWNLOADS", "HUB", "SPLIT_SEED", "SPLITS",
    "DataError", "Example", "MissingDataError", "data_dir", "describe_data_dir", "load_dataset", "split_hyper_validation", "subset", "training_pairs",
    "use_local_nltk_data",
]
