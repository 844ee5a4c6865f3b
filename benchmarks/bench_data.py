"""A split built from its files against the same split loaded again in the process; every ratio
comes from this run.

    python benchmarks/bench_data.py [--repeats 5]

``data.load_dataset`` builds each split once per process while its files stay the same (size,
modification time and inode; ``data.files.files_signature``) and copies it for each caller. The
judges of the preregistered waves and the fine-tuning pool load the splits hundreds of times.
Prints, per dataset split: the seconds of a build (the kept splits cleared first), the median
seconds of a later load, their ratio, and whether the two give equal examples.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import pandas as pd

from plugin_lib.data import datasets


def timed(name: str, split: str) -> tuple[float, list]:
    start = time.perf_counter()
    examples = datasets.load_dataset(name, split)
    return time.perf_counter() - start, examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="later loads timed per split")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # CommonGen's v1.0 fallback warns at every load
    rows = []
    for name, splits in datasets.SPLITS.items():
        for split in splits:
            datasets._LOADED.clear()
            try:
                built, first = timed(name, split)
            except FileNotFoundError as err:  # e.g. E2E's optional train file
                print(f"{name} {split}: skipped ({str(err).splitlines()[0][:80]}...)")
                continue
            later = [timed(name, split) for _ in range(args.repeats)]
            again = statistics.median(seconds for seconds, _ in later)
            rows.append({"dataset": name, "split": split, "inputs": len(first), "build s": round(built, 4),
                         "later load s": round(again, 5), "build / later": round(built / again, 1),
                         "equal": all(examples == first for _, examples in later)})
    print(pd.DataFrame(rows).to_markdown(index=False))


if __name__ == "__main__":
    main()
