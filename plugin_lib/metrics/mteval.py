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
from collections.abc import Callable

from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

NIST_ORDER = 5
# mteval's length penalty is 0.5 when the system output is 2/3 of the reference length.
_NIST_BETA = -math.log(0.5) / math.log(1.5) ** 2
_tokenize_13a = Tokenizer13a()


def corpus_bleu(predictions: list[str], references: list[list[str]]) -> float:
    """Corpus BLEU-4 on the 0-1 scale, as mteval-v13a computes it.

    sacrebleu with ``lowercase=True`` and the 13a tokenizer reproduces mteval: clipped n-gram
    counts against the per-n-gram maximum over the references, brevity penalty from the
    reference closest in length to each prediction (the shorter one on ties), and mteval's
    "exp" smoothing of zero n-gram matches. References are passed as streams padded with
    None, which sacrebleu (like e2e-metrics' mteval) treats as "no reference here".

    One divergence on degenerate corpora: when no prediction has four tokens, mteval
    counts the missing 4-gram precision as 1, sacrebleu's BLEU is 0.
    """
    streams = [
        [refs[k] if k < len(refs) else None for refs in references]
        for k in range(max(len(refs) for refs in references))
    ]
    bleu = BLEU(lowercase=True, tokenize="13a")
    return bleu.corpus_score(predictions, streams).score / 100.0


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
    return _corpus_nist(predictions, references, _pooled_reference_length)


def corpus_nist_per_input_average(predictions: list[str], references: list[list[str]]) -> float:
    """NIST as ``corpus_nist`` but with L_ref = sum over inputs of the mean length of that
    input's references: the definition of e2e-metrics' Python port (``metrics/pymteval.py``,
    ``measure_scores.py -p``), which its docstring calls the proper one. It is not what the
    official (Perl) scorer reports when reference counts differ, so no table uses it."""
    return _corpus_nist(predictions, references, _per_input_average_reference_length)


def _pooled_reference_length(tokenized_refs: list[list[list[str]]]) -> float:
    """Inputs x the pooled mean reference length (mteval-v13a-sig.pl's L_ref)."""
    lengths = [len(ref) for refs in tokenized_refs for ref in refs if ref]
    return len(tokenized_refs) * sum(lengths) / len(lengths)


def _per_input_average_reference_length(tokenized_refs: list[list[list[str]]]) -> float:
    """Sum over inputs of the mean length of the input's non-empty references (pymteval's)."""
    total = 0.0
    for refs in tokenized_refs:
        lengths = [len(ref) for ref in refs if ref]
        total += sum(lengths) / len(lengths)
    return total


def _corpus_nist(predictions: list[str], references: list[list[str]],
                 reference_length: Callable[[list[list[list[str]]]], float]) -> float:
    """NIST with the reference length L_ref of the brevity penalty given by ``reference_length``."""
    tokenized_refs = [[mteval_tokens(ref) for ref in refs] for refs in references]
    if any(not any(refs) for refs in tokenized_refs):
        raise ValueError("NIST needs at least one non-empty reference per input.")
    info = _information_weights(tokenized_refs)
    matched_info = [0.0] * NIST_ORDER
    prediction_ngrams = [0] * NIST_ORDER
    system_length = 0
    for prediction, refs in zip(predictions, tokenized_refs, strict=True):
        tokens = mteval_tokens(prediction)
        for ngram, count in _clipped_matches(tokens, refs).items():
            matched_info[len(ngram) - 1] += count * info[ngram]
        for n in range(1, NIST_ORDER + 1):
            prediction_ngrams[n - 1] += max(len(tokens) - n + 1, 0)
        system_length += len(tokens)
    score = sum(m / max(c, 1) for m, c in zip(matched_info, prediction_ngrams))
    return score * nist_brevity_penalty(system_length / reference_length(tokenized_refs))


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


def _information_weights(tokenized_refs: list[list[list[str]]]) -> dict[tuple, float]:
    """info(g) for every n-gram g of the references (see ``corpus_nist``)."""
    counts = Counter()
    for refs in tokenized_refs:
        for ref in refs:
            counts.update(_ngrams(ref))
    # The empty tuple is every unigram's prefix: its count is the number of reference words.
    counts[()] = sum(len(ref) for refs in tokenized_refs for ref in refs)
    return {g: math.log2(counts[g[:-1]] / c) for g, c in counts.items() if g}


def _clipped_matches(tokens: list[str], refs: list[list[str]]) -> Counter:
    """Prediction n-grams found in the references, each clipped to its largest count in
    any single reference."""
    max_ref_counts = Counter()
    for ref in refs:
        max_ref_counts |= _ngrams(ref)  # | keeps the maximum count per n-gram
    return _ngrams(tokens) & max_ref_counts  # & keeps the minimum, dropping unmatched ones
