"""The paper's four datasets (``datasets``) and its prompts (``prompts``)."""
from .datasets import (
    ADIDAS_FIELDS,
    ADIDAS_TEST_ROWS,
    ALL_SPLITS,
    DATASETS,
    DOWNLOADS,
    SPLIT_SEED,
    SPLITS,
    Example,
    MissingDataError,
    data_dir,
    load_dataset,
    split_hyper_validation,
    training_pairs,
    use_local_nltk_data,
)

__all__ = [
    "ADIDAS_FIELDS", "ADIDAS_TEST_ROWS", "ALL_SPLITS", "DATASETS", "DOWNLOADS", "SPLIT_SEED", "SPLITS",
    "Example", "MissingDataError", "data_dir", "load_dataset", "split_hyper_validation", "training_pairs",
    "use_local_nltk_data",
]
