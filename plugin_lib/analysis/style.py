"""The "Adidas domain": the top-50 style words of the product descriptions, and how much of
generated text is made of them (section "Qualitative Analysis and Case Study", paragraph
"Case study", Appendix "Details for Adidas Qualitative Studies").

Text handling, the paper's recipe: lowercase; special characters and digits removed; NLTK's
``word_tokenize``; NLTK's English stopwords removed; no stemming or lemmatisation.

Choice: each removed character is replaced by a space (``separator=" "``), so "you're" gives
the stopword fragments "you" + "re" and "high-performance" gives "high" + "performance".
Deleting the characters instead (``separator=""``, the literal reading) merges them into
non-words such as "youre" and "highperformance", which then enter the top 50.
"""
from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import pandas as pd

from .. import data

TOP_WORDS = 50
NOT_A_LETTER = re.compile(r"[^a-z\s]")  # applied after lowercasing: digits, punctuation, accents

COVERAGE_READINGS = ("token_share", "per_output_vocabulary", "corpus_vocabulary")


@functools.lru_cache(maxsize=1)
def english_stopwords() -> frozenset[str]:
    """NLTK's English stopword list (the ``stopwords`` corpus under ``NLTK_DATA`` or the data dir)."""
    from nltk.corpus import stopwords

    data.use_local_nltk_data()
    return frozenset(stopwords.words("english"))


def content_words(text: str, separator: str = " ") -> list[str]:
    """The words of ``text`` that the style-word recipe counts, in order."""
    from nltk.tokenize import word_tokenize

    data.use_local_nltk_data()
    cleaned = NOT_A_LETTER.sub(separator, text.lower())
    stop = english_stopwords()
    return [word for word in word_tokenize(cleaned) if word not in stop]


def style_words(texts: Iterable[str], top: int = TOP_WORDS, separator: str = " ") -> pd.DataFrame:
    """The ``top`` most frequent content words of ``texts``: columns ``word``, ``count``.

    Ties in count are broken alphabetically, so the list never depends on input order.
    """
    counts = Counter(word for text in texts for word in content_words(text, separator))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:top]
    return pd.DataFrame(ranked, columns=["word", "count"])


def adidas_descriptions() -> list[str]:
    """Every Adidas product description (validation and test rows, one per CSV row)."""
    return [reference for split in data.SPLITS["adidas"]
            for example in data.load_dataset("adidas", split)
            for reference in example.references]


def _word_set(domain_words: pd.DataFrame | Iterable[str]) -> frozenset[str]:
    if isinstance(domain_words, pd.DataFrame):
        domain_words = domain_words["word"]
    return frozenset(domain_words)


def domain_word_coverage(outputs: Sequence[str], domain_words: pd.DataFrame | Iterable[str],
                         reading: str = "token_share", separator: str = " ") -> float:
    """How much of ``outputs`` is "Adidas domain" language, under one of three readings.

    The paper: "we measure the total occurrences of the top-50 'Adidas domain' words in
    generated outputs: Plugin includes 25.6% of these terms compared to 13.8% in the base
    model". Words are the style-word recipe's content words (see :func:`content_words`).

    - ``token_share`` (default): occurrences of domain words / all content words of the
      outputs, pooled over outputs. It counts "total occurrences", as the sentence says, and
      is the only reading that puts the paper's numbers in a plausible place: the reference
      descriptions themselves score about 0.32 (Plugin 0.256 < references, base 0.138).
    - ``per_output_vocabulary``: the share of the domain words that an output contains at
      least once, averaged over outputs (references: about 0.20).
    - ``corpus_vocabulary``: the share of the domain words that occur at least once anywhere in
      the outputs (references: 0.98 on the 100 test descriptions; saturates quickly).

    ``domain_words`` is a :func:`style_words` table or any iterable of words. Outputs without
    content words count as 0 under ``per_output_vocabulary``; with no content words at all,
    ``token_share`` is 0.
    """
    if reading not in COVERAGE_READINGS:
        raise ValueError(f"Unknown reading {reading!r}; choose one of {COVERAGE_READINGS}.")
    vocabulary = _word_set(domain_words)
    if not vocabulary:
        raise ValueError("domain_words is empty.")
    if not outputs:
        raise ValueError("No outputs to measure.")
    words = [content_words(text, separator) for text in outputs]
    if reading == "token_share":
        total = sum(len(w) for w in words)
        hits = sum(word in vocabulary for w in words for word in w)
        return hits / total if total else 0.0
    if reading == "per_output_vocabulary":
        return sum(len(vocabulary & set(w)) for w in words) / (len(vocabulary) * len(words))
    return len(vocabulary & {word for w in words for word in w}) / len(vocabulary)


def coverage_readings(outputs: Sequence[str], domain_words: pd.DataFrame | Iterable[str],
                      separator: str = " ") -> dict[str, float]:
    """:func:`domain_word_coverage` under every reading, keyed by reading."""
    return {reading: domain_word_coverage(outputs, domain_words, reading, separator)
            for reading in COVERAGE_READINGS}


def coverage_counts(outputs: Sequence[str], words: pd.DataFrame | Iterable[str]) -> tuple[list[int], list[int]]:
    """Per output: domain-word occurrences and content words (``domain_word_coverage``'s token
    share is their pooled ratio)."""
    vocabulary = _word_set(words)
    tokens = [content_words(text) for text in outputs]
    return [sum(w in vocabulary for w in t) for t in tokens], [len(t) for t in tokens]
