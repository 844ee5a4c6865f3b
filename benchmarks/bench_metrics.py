"""Wall time of ``compute_metrics`` on 1,000 real E2E test inputs, per metric and for all seven.

Predictions are the first human reference of each multi-reference MR, references the others.
A warm-up METEOR pass over the same inputs starts the Java process and warms its JIT first, so
the times exclude that one-off cost (reported separately). Data come from the package's data
folder (``PLUGIN_DATA_DIR``, else data/).

    python benchmarks/bench_metrics.py [--inputs 1000]
"""
from __future__ import annotations

import argparse
import csv
import time

from plugin_lib.data import files
from plugin_lib.metrics import METRIC_NAMES, compute_metrics


def load_e2e_test(n_inputs: int) -> tuple[list[str], list[list[str]]]:
    """First ``n_inputs`` multi-reference MRs of the E2E test set: (predictions, references)."""
    groups: dict[str, list[str]] = {}
    with open(files.local_path("e2e_cleaned/test-fixed.csv"), encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            groups.setdefault(row["mr"], []).append(row["ref"])
    multi = [refs for refs in groups.values() if len(refs) > 1][:n_inputs]
    return [refs[0] for refs in multi], [refs[1:] for refs in multi]


def timed(predictions, references, metrics) -> tuple[float, dict[str, float]]:
    start = time.perf_counter()
    scores = compute_metrics(predictions, references, metrics=metrics)
    return time.perf_counter() - start, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1000)
    args = parser.parse_args()
    predictions, references = load_e2e_test(args.inputs)
    n_refs = sum(len(refs) for refs in references)
    print(f"{len(predictions)} inputs, {n_refs} references")

    startup, _ = timed(predictions, references, ("METEOR",))
    print(f"warm-up (METEOR Java start + first pass): {startup:.2f} s")
    for name in METRIC_NAMES:
        seconds, scores = timed(predictions, references, (name,))
        print(f"{name:8s} {seconds:6.2f} s   score {scores[name]:.4f}")
    seconds, _ = timed(predictions, references, METRIC_NAMES)
    print(f"{'all 7':8s} {seconds:6.2f} s")


if __name__ == "__main__":
    main()
