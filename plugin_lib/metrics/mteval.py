"""BLEU and NIST as the E2E NLG Challenge's official scorer computes them: tuetschek/e2e-metrics'
``measure_scores.py`` with its edited ``mteval/mteval-v13a-sig.pl`` (references padded with empty
ones to the largest count, which count for nothing). ``tests/test_metrics.py`` checks both
against that script's output on corpora with unequal reference counts
(``tests/fixtures/mteval_official.json``, made by ``scripts/make_mteval_fixtures.py``).

Both metrics see the same text: lowercased, then split by mteval's own ("13a") tokenisation
(sacrebleu's ``Tokenizer13a`` reproduces it). mteval lowercases ASCII letters only; we
lowercase with ``str.lower``, which differs only for non-ASCII capitals.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
from scipy import sparse

NIST_ORDER = 5
# mteval's length penalty is 0.5 when the system output is 2/3 of the reference length.
_NIST_BETA = -math.log(0.5) / math.log(1.5) ** 2
BLEU_ORDER = 4
_tokenize_13a = Tokenizer13a()
# mteval's BLEU: lowercased, 13a tokens, "exp" smoothing of n-gram orders without matches.
_BLEU = BLEU(lowercase=True, tokenize="13a", smooth_method="exp", max_ngram_order=BLEU_ORDER)


def corpus_bleu(predictions: list[str], references: list[list[str]]) -> float:
    """Corpus BLEU-4 on the 0-1 scale, as mteval-v13a computes it.

    sacrebleu with ``lowercase=True`` and the 13a tokenizer reproduces mteval: clipped n-gram
    counts against the per-n-gram maximum over the references, brevity penalty from the
    reference closest in length to each prediction (the shorter one on ties), and mteval's
    "exp" smoothing of zero n-gram matches. References are passed as streams padded with
    None, which sacrebleu (like e2e-metrics' mteval) treats as "no reference here".

    One divergence on degenerate corpora: when no prediction has four tokens, mteval
    counts the missing 4-gram precision as 1, sacrebleu's BLEU is 0.
    ``tests/test_metrics.py`` checks it against e2e-metrics' Perl output.
    """
    streams = [
        [refs[k] if k < len(refs) else None for refs in references]
        for k in range(max(len(refs) for refs in references))
    ]
    return _BLEU.corpus_score(predictions, streams).score / 100.0


class BleuStatistics:
    """Per-input BLEU statistics (prediction length, closest reference length, matched and
    total n-grams for n = 1..4, as sacrebleu counts them), from which ``corpus_bleu`` of any
    resampling of the inputs follows: corpus BLEU depends on the corpus only through their
    sums."""

    def __init__(self, predictions: list[str], references: list[list[str]]) -> None:
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists.")
        rows = []
        for prediction, refs in zip(predictions, references):
            score = _BLEU.corpus_score([prediction], [[ref] for ref in refs])
            rows.append([score.sys_len, score.ref_len, *score.counts, *score.totals])
        self.n_inputs = len(rows)
        self._statistics = np.array(rows, dtype=np.int64).reshape(self.n_inputs, 2 + 2 * BLEU_ORDER)

    def scores(self, counts: np.ndarray) -> np.ndarray:
        """BLEU (0-1) of each row's resampled corpus: ``counts[b, i]`` = how often input i is
        drawn (shape resamples x inputs)."""
        counts = np.asarray(counts)
        if counts.ndim != 2 or counts.shape[1] != self.n_inputs:
            raise ValueError(f"counts must have shape (resamples, {self.n_inputs}), got {counts.shape}.")
        sums = np.rint(counts).astype(np.int64) @ self._statistics
        return np.array([
            BLEU.compute_bleu([int(c) for c in row[2:2 + BLEU_ORDER]], [int(t) for t in row[2 + BLEU_ORDER:]],
                              int(row[0]), int(row[1]), smooth_method=_BLEU.smooth_method,
                              max_ngram_order=BLEU_ORDER).score / 100.0
            for row in sums
        ])


def mteval_tokens(text: str) -> list[str]:
    """Lowercased mteval-13a tokens of ``text``."""
    return _tokenize_13a(text.lower()).split()


def corpus_nist(predictions: list[str], references: list[list[str]]) -> float:
    """Corpus NIST (n=5) as the E2E NLG Challenge's official scorer computes it: e2e-metrics'
    ``measure_scores.py`` running its ``mteval/mteval-v13a-sig.pl`` (tuetschek/e2e-metrics,
    commit 1b9c4d8; the Perl was edited there to count non-empty references only).

    - Information weight of an n-gram g = w1..wn, from the counts over ALL reference
      sentences of the corpus, each reference counted: info(g) = log2(count(w1..wn-1) /
      count(g)); for unigrams the numerator is the total number of reference words. Prefix
      counts include prefixes at sentence ends, as mteval counts them.
    - Matches are clipped as in BLEU: a prediction n-gram counts min(its count, the
      largest count of that n-gram in any single reference of the input) times.
    - Score = sum over n = 1..5 of (information of the matched n-grams of order n, summed
      over the corpus) / (number of prediction n-grams of order n, at least 1), times the
      brevity penalty.
    - Brevity penalty exp(-beta * ln(min(L_sys / L_ref, 1))^2), beta chosen so that it is
      0.5 at a ratio of 2/3; L_sys = total prediction length; L_ref = number of inputs x the
      mean length of ALL references of the corpus, pooled (the Perl's total reference words /
      (non-empty references / inputs)). An input with many references weighs more in that
      mean than one with few; with equal reference counts it equals the sum over inputs of
      each input's mean reference length (``corpus_nist_per_input_average``).
    """
    return float(NistStatistics(predictions, references).scores(np.ones((1, len(predictions))))[0])


def corpus_nist_per_input_average(predictions: list[str], references: list[list[str]]) -> float:
    """NIST as ``corpus_nist`` but with L_ref = sum over inputs of the mean length of that
    input's references: the definition of e2e-metrics' Python port (``metrics/pymteval.py``,
    ``measure_scores.py -p``), which its docstring calls the proper one. It is not what the
    official (Perl) scorer reports when reference counts differ, so no table uses it."""
    return NistStatistics(predictions, references).per_input_average_score()


class NistStatistics:
    """Per-input counts from which ``corpus_nist`` of the corpus, or of any resampling of its
    inputs, follows without reading the texts again (a bootstrap needs thousands of them).

    A resampled corpus that holds input i c_i times holds c_i copies of its references,
    matches and lengths, so every count of the definition is a sum over inputs weighted by
    c_i; ``scores`` takes those c_i. Information weights are needed only for the n-grams a
    prediction matches, and every prefix of a matched n-gram is matched as well, so the
    counts kept are those of the matched n-grams, in every input's references.
    """

    def __init__(self, predictions: list[str], references: list[list[str]]) -> None:
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists.")
        tokenized_refs = [[tokens for tokens in map(mteval_tokens, refs) if tokens] for refs in references]
        if not tokenized_refs or any(not refs for refs in tokenized_refs):
            raise ValueError("NIST needs at least one input and a non-empty reference for every input.")
        tokenized_predictions = [mteval_tokens(p) for p in predictions]
        reference_ngrams = [[_ngrams(ref) for ref in refs] for refs in tokenized_refs]
        matches = [_clipped_matches(_ngrams(tokens), ngrams)
                   for tokens, ngrams in zip(tokenized_predictions, reference_ngrams)]
        vocabulary = sorted(set().union(*matches), key=lambda g: (len(g), g))
        column = {g: j for j, g in enumerate(vocabulary)}
        self.n_inputs = len(predictions)
        self._order = np.array([len(g) for g in vocabulary], dtype=int)
        # Column of each n-gram's prefix count; unigrams' prefix is the reference word total,
        # kept as one extra column after the n-grams.
        self._prefix = np.array([column[g[:-1]] if len(g) > 1 else len(vocabulary) for g in vocabulary], dtype=int)
        shape = (self.n_inputs, len(vocabulary))
        # Reference counts of the matched n-grams in every input's references (information
        # weights pool all references), and each input's own clipped matches.
        rows, columns, values = [], [], []
        for i, ngrams in enumerate(reference_ngrams):
            for ref in ngrams:
                for g, count in ref.items():
                    if g in column:
                        rows.append(i)
                        columns.append(column[g])
                        values.append(count)
        self._reference_counts = sparse.csr_matrix((values, (rows, columns)), shape=shape, dtype=float)
        rows = [i for i, found in enumerate(matches) for _ in found]
        columns = [column[g] for found in matches for g in found]
        values = [count for found in matches for count in found.values()]
        self._matched = sparse.csr_matrix((values, (rows, columns)), shape=shape, dtype=float)
        self._reference_words = np.array([sum(map(len, refs)) for refs in tokenized_refs], dtype=float)
        self._reference_sentences = np.array([len(refs) for refs in tokenized_refs], dtype=float)
        self._prediction_ngrams = np.array(
            [[max(len(tokens) - n + 1, 0) for n in range(1, NIST_ORDER + 1)] for tokens in tokenized_predictions],
            dtype=float)

    def scores(self, counts: np.ndarray) -> np.ndarray:
        """NIST of each row's resampled corpus: ``counts[b, i]`` = how often input i is drawn
        (shape resamples x inputs; a row of ones is the corpus itself)."""
        counts = np.asarray(counts, dtype=float)
        if counts.ndim != 2 or counts.shape[1] != self.n_inputs:
            raise ValueError(f"counts must have shape (resamples, {self.n_inputs}), got {counts.shape}.")
        unpenalised, system_length = self._unpenalised(counts)
        # L_ref: inputs x the pooled mean reference length, as mteval-v13a-sig.pl computes it.
        reference_length = counts.sum(axis=1) * (counts @ self._reference_words) / (counts @ self._reference_sentences)
        return unpenalised * np.array([nist_brevity_penalty(r) for r in system_length / reference_length])

    def per_input_average_score(self) -> float:
        """The corpus's NIST with pymteval's L_ref (``corpus_nist_per_input_average``)."""
        unpenalised, system_length = self._unpenalised(np.ones((1, self.n_inputs)))
        reference_length = (self._reference_words / self._reference_sentences).sum()
        return float(unpenalised[0] * nist_brevity_penalty(system_length[0] / reference_length))

    def _unpenalised(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the sum over n of matched information / prediction n-grams, and L_sys."""
        reference_counts = np.asarray((self._reference_counts.T @ counts.T).T)
        matched = np.asarray((self._matched.T @ counts.T).T)
        prefix_counts = np.column_stack([reference_counts, counts @ self._reference_words])[:, self._prefix]
        drawn = matched > 0  # an n-gram matched in a drawn input also occurs in its references
        info = np.zeros_like(matched)
        np.log2(prefix_counts / np.where(drawn, reference_counts, 1.0), out=info, where=drawn)
        matched_info = np.stack([(matched * info)[:, self._order == n].sum(axis=1)
                                 for n in range(1, NIST_ORDER + 1)], axis=1)
        prediction_ngrams = counts @ self._prediction_ngrams
        return (matched_info / np.maximum(prediction_ngrams, 1)).sum(axis=1), prediction_ngrams[:, 0]


def nist_brevity_penalty(ratio: float) -> float:
    """mteval's NIST length penalty for ``ratio`` = system length / reference length."""
    if ratio >= 1:
        return 1.0
    if ratio <= 0:
        return 0.0
    return math.exp(-_NIST_BETA * math.log(ratio) ** 2)


def _ngrams(tokens: list[str]) -> Counter:
    """Counts of all n-grams of ``tokens`` with 1 <= n <= NIST_ORDER, as tuples."""
    return Counter(
        tuple(tokens[i : i + n])
        for n in range(1, NIST_ORDER + 1)
        for i in range(len(tokens) - n + 1)
    )


def _clipped_matches(prediction: Counter, references: list[Counter]) -> Counter:
    """The prediction's n-grams (``_ngrams`` counts) found in the references', each clipped
    to its largest count in any single reference."""
    max_ref_counts = Counter()
    for ref in references:
        max_ref_counts |= ref  # | keeps the maximum count per n-gram
    return prediction & max_ref_counts  # & keeps the minimum, dropping unmatched ones
