"""The paper's four datasets (``datasets``) and its prompts (``prompts``); where the data files
come from (``sources``, ``python -m plugin_lib.data.fetch``) and how they are checked
(``integrity``, ``python -m plugin_lib.data.check``)."""
from .datasets import (
    ADIDAS_FIELDS,
    ADIDAS_TEST_ROWS,
    ALL_SPLITS,
    DATASETS,
    DOWNLOADS,
    HUB,
    SPLIT_SEED,
    SPLITS,
    DataError,
    Example,
    MissingDataError,
    data_dir,
    describe_data_dir,
    load_dataset,
    split_hyper_validation,
    subset,
    training_pairs,
    use_local_nltk_data,
)

__all__ = [
    "ADIDAS_FIELDS", "ADIDAS_TEST_ROWS", "ALL_SPLITS", "DATASETS", "DOWNLOADS", "HUB", "SPLIT_SEED", "SPLITS",
    "DataError", "Example", "MissingDataError", "data_dir", "describe_data_dir", "load_dataset", "split_hyper_validation", "subset", "training_pairs",
    "use_local_nltk_data",
]
