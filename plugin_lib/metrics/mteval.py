"""BLEU and NIST as defined by mteval-v13a, the script the E2E NLG Challenge uses.

Both metrics see the same text: lowercased, then split by mteval's own ("13a") tokenisation
(sacrebleu's ``Tokenizer13a`` reproduces it). mteval lowercases ASCII letters only; we
lowercase with ``str.lower``, which differs only for non-ASCII capitals.
"""
from __future__ import annotations

import math
from collections import Counter

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
    """Corpus NIST (n=5) by the mteval-v13a definition.

    - Information weight of an n-gram g = w1..wn, from the counts over ALL reference
      sentences of the corpus: info(g) = log2(count(w1..wn-1) / count(g)); for unigrams the
      numerator is the total number of reference words. Prefix counts include prefixes at
      sentence ends, as mteval counts them.
    - Matches are clipped as in BLEU: a prediction n-gram counts min(its count, the
      largest count of that n-gram in any single reference of the input) times.
    - Score = sum over n = 1..5 of (information of the matched n-grams of order n, summed
      over the corpus) / (number of prediction n-grams of order n, at least 1), times the
      brevity penalty.
    - Brevity penalty exp(-beta * ln(min(L_sys / L_ref, 1))^2), beta chosen so that it is
      0.5 at a ratio of 2/3; L_sys = total prediction length; L_ref = sum over inputs of the
      AVERAGE length of that input's references. (e2e-metrics' Perl run pads inputs with
      fewer references with empty ones and divides by the maximum number of references,
      which shrinks L_ref; its own Python port, pymteval, averages per input as here and
      calls that the proper definition. With equal reference counts both agree.)
    """
    tokenized_refs = [[mteval_tokens(ref) for ref in refs] for refs in references]
    info = _information_weights(tokenized_refs)
    matched_info = [0.0] * NIST_ORDER
    prediction_ngrams = [0] * NIST_ORDER
    system_length = 0
    reference_length = 0.0
    for prediction, refs in zip(predictions, tokenized_refs):
        tokens = mteval_tokens(prediction)
        for ngram, count in _clipped_matches(tokens, refs).items():
            matched_info[len(ngram) - 1] += count * info[ngram]
        for n in range(1, NIST_ORDER + 1):
            prediction_ngrams[n - 1] += max(len(tokens) - n + 1, 0)
        system_length += len(tokens)
        reference_length += sum(len(ref) for ref in refs) / len(refs)
    score = sum(m / max(c, 1) for m, c in zip(matched_info, prediction_ngrams))
    return score * nist_brevity_penalty(system_length / reference_length)


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
