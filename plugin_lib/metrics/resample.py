"""Corpus metrics of resampled test sets, for a bootstrap over test inputs.

A bootstrap draws the test inputs with replacement and scores each drawn corpus as
``compute_metrics`` would score it (a corpus that holds input i twice holds its prediction
and references twice). Re-reading the texts for every draw is slow, so ``InputStatistics``
gathers once what each metric needs per input and scores many draws at a time from how often
each input was drawn. The result equals ``compute_metrics`` on the drawn corpus
(``tests/test_metrics.py`` checks it).

- BLEU: sums of per-input statistics (``mteval.BleuStatistics``).
- NIST: per-input reference and match counts of the matched n-grams (``mteval.NistStatistics``);
  information weights and the reference length are recomputed for every draw.
- ROUGE-1/2 and ROUGE-L: means over inputs of per-input scores (ROUGE-L needs Java once, for
  the PTB tokenizer).

METEOR (corpus-level, one Java exchange per corpus) and CIDEr-D (idf from the references of
the whole corpus, recomputed per draw by pycocoevalcap only) are not resampled.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import check_metric_names, coco, mteval, normalise_inputs, ptb_tokenized, sentence_rouge

RESAMPLABLE_METRICS = ("BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "NIST")


def resample_counts(n_inputs: int, n_resamples: int, seed: int) -> np.ndarray:
    """How often each input is drawn in each of ``n_resamples`` bootstrap samples of
    ``n_inputs`` inputs (drawn uniformly with replacement; seeded): shape resamples x inputs."""
    if n_inputs < 1 or n_resamples < 1:
        raise ValueError(f"Need at least one input and one resample, got {n_inputs} and {n_resamples}.")
    draws = np.random.default_rng(seed).integers(0, n_inputs, size=(n_resamples, n_inputs))
    counts = np.zeros((n_resamples, n_inputs), dtype=np.int64)
    np.add.at(counts, (np.arange(n_resamples)[:, None], draws), 1)
    return counts


class InputStatistics:
    """One system's per-input statistics for ``metrics`` (a subset of ``RESAMPLABLE_METRICS``);
    ``scores(counts)`` gives each metric for every drawn corpus."""

    def __init__(self, predictions: Sequence[str], references: Sequence[Sequence[str]],
                 metrics: Sequence[str] = RESAMPLABLE_METRICS) -> None:
        wanted = check_metric_names(metrics)
        unsupported = sorted(wanted - set(RESAMPLABLE_METRICS))
        if unsupported:
            raise ValueError(f"{unsupported} cannot be resampled from per-input statistics; "
                             f"choose from {RESAMPLABLE_METRICS}.")
        self.metrics = [m for m in RESAMPLABLE_METRICS if m in wanted]
        predictions, references = normalise_inputs(predictions, references)
        self.n_inputs = len(predictions)
        self._corpus: dict[str, mteval.BleuStatistics | mteval.NistStatistics] = {}
        self._per_input: dict[str, np.ndarray] = {}
        if "BLEU" in wanted:
            self._corpus["BLEU"] = mteval.BleuStatistics(predictions, references)
        if "NIST" in wanted:
            self._corpus["NIST"] = mteval.NistStatistics(predictions, references)
        if {"ROUGE-1", "ROUGE-2"} & wanted:
            rouge = [sentence_rouge(p, refs) for p, refs in zip(predictions, references)]
            for name in {"ROUGE-1", "ROUGE-2"} & wanted:
                self._per_input[name] = np.array([r[name] for r in rouge])
        if "ROUGE-L" in wanted:
            self._per_input["ROUGE-L"] = np.array(coco.sentence_rouge_l(*ptb_tokenized(predictions, references)))

    def scores(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        """Each metric of each drawn corpus: ``counts[b, i]`` = how often input i is in draw b
        (``resample_counts``; a row of ones is the corpus itself)."""
        counts = np.asarray(counts)
        if counts.ndim != 2 or counts.shape[1] != self.n_inputs:
            raise ValueError(f"counts must have shape (resamples, {self.n_inputs}), got {counts.shape}.")
        if (counts < 0).any() or (counts.sum(axis=1) == 0).any():
            raise ValueError("Every draw needs non-negative counts and at least one input.")
        result = {}
        for name in self.metrics:
            if name in self._corpus:
                result[name] = self._corpus[name].scores(counts)
            else:
                result[name] = counts @ self._per_input[name] / counts.sum(axis=1)
        return result
