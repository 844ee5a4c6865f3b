"""The paper's seven metrics, by the official E2E NLG Challenge definitions (tuetschek/e2e-metrics)
plus ROUGE-1/2 from Google's ``rouge_score``.

``compute_metrics(predictions, references)`` scores one prediction per unique input against
that input's references and returns ``{"BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "METEOR",
"CIDEr", "NIST"}``. BLEU, ROUGE and METEOR are on the 0-1 scale, CIDEr-D on coco-caption's
0-10 scale, NIST absolute. Definitions: ``mteval`` (BLEU, NIST) and ``coco`` (METEOR,
ROUGE-L, CIDEr-D) modules; ROUGE-1/2 in ``sentence_rouge``.
"""
from __future__ import annotations

from collections.abc import Sequence

from rouge_score import rouge_scorer

from . import coco, java, mteval

METRIC_NAMES = ("BLEU", "ROUGE-1", "ROUGE-2", "ROUGE-L", "METEOR", "CIDEr", "NIST")
_COCO_METRICS = {"ROUGE-L", "METEOR", "CIDEr"}
# No stemming: the setting of the Hugging Face `evaluate` ROUGE the paper's authors ran.
_ROUGE = rouge_scorer.RougeScorer(["rouge1", "rouge2"], use_stemmer=False)


def compute_metrics(
    predictions: Sequence[str],
    references: Sequence[Sequence[str]],
    metrics: Sequence[str] = METRIC_NAMES,
) -> dict[str, float]:
    """Score ``predictions[i]`` against ``references[i]`` (all references of input i).

    Text handling, common to all metrics: every line break is replaced by a space (the
    official tools read one text per line); empty or whitespace-only references are dropped,
    and each input needs at least one reference left. Empty predictions are allowed.

    - BLEU, NIST: as e2e-metrics' Perl mteval-v13a-sig.pl computes them (case-insensitive,
      13a tokenisation, corpus level; NIST's reference length from the pooled mean length of
      all references): ``mteval.corpus_bleu``, ``mteval.corpus_nist``.
    - METEOR 1.5 (``-l en -norm``, corpus level), ROUGE-L (beta 1.2, mean over inputs),
      CIDEr-D (mean over inputs) on PTB-tokenised text, as coco-caption (``coco`` module).
      These need Java; pass ``metrics`` without them to skip it.
    - ROUGE-1/2: ``rouge_score`` F-measure without stemming, best reference per input,
      plain mean over inputs (``sentence_rouge``).

    ``metrics`` selects a subset of ``METRIC_NAMES``; the result keeps their canonical order.
    """
    wanted = check_metric_names(metrics)
    predictions, references = normalise_inputs(predictions, references)
    scores: dict[str, float] = {}
    if "BLEU" in wanted:
        scores["BLEU"] = mteval.corpus_bleu(predictions, references)
    if {"ROUGE-1", "ROUGE-2"} & wanted:
        per_input = [sentence_rouge(p, refs) for p, refs in zip(predictions, references)]
        for name in ("ROUGE-1", "ROUGE-2"):
            scores[name] = sum(s[name] for s in per_input) / len(per_input)
    if _COCO_METRICS & wanted:
        scores.update(_coco_scores(predictions, references, wanted))
    if "NIST" in wanted:
        scores["NIST"] = mteval.corpus_nist(predictions, references)
    return {name: scores[name] for name in METRIC_NAMES if name in wanted}


def sentence_rouge(prediction: str, references: Sequence[str]) -> dict[str, float]:
    """ROUGE-1 and ROUGE-2 F-measures of one prediction against its best reference.

    ``rouge_score`` tokenisation: lowercased, runs of characters other than ASCII letters
    and digits are separators (so accented letters split words and CJK text has no tokens).
    The best reference is chosen per metric (highest F-measure), as ``score_multi`` does.
    """
    if not references:
        raise ValueError("sentence_rouge needs at least one reference.")
    best = _ROUGE.score_multi(list(references), prediction)
    return {"ROUGE-1": best["rouge1"].fmeasure, "ROUGE-2": best["rouge2"].fmeasure}


def _coco_scores(
    predictions: list[str], references: list[list[str]], wanted: set[str]
) -> dict[str, float]:
    """The requested coco-caption metrics, from one PTB tokenisation of all texts."""
    tokenized_predictions, tokenized_references = ptb_tokenized(predictions, references)
    scorers = {
        "METEOR": coco.METEOR.corpus_score,
        "ROUGE-L": coco.corpus_rouge_l,
        "CIDEr": coco.corpus_cider_d,
    }
    return {
        name: scorer(tokenized_predictions, tokenized_references)
        for name, scorer in scorers.items()
        if name in wanted
    }


def ptb_tokenized(predictions: list[str], references: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Predictions and references PTB-tokenised for the coco-caption scorers, in one Java call."""
    java.ensure_java()
    tokens = coco.ptb_tokenize(predictions + [r for refs in references for r in refs])
    tokenized_references, start = [], len(predictions)
    for refs in references:
        tokenized_references.append(tokens[start : start + len(refs)])
        start += len(refs)
    return tokens[: len(predictions)], tokenized_references


def check_metric_names(metrics: Sequence[str]) -> set[str]:
    """The requested metric names as a set; unknown names raise ValueError."""
    if isinstance(metrics, str):
        metrics = (metrics,)
    unknown = [m for m in metrics if m not in METRIC_NAMES]
    if unknown or not metrics:
        raise ValueError(f"Unknown or no metrics {unknown}; choose from {METRIC_NAMES}.")
    return set(metrics)


def normalise_inputs(
    predictions: Sequence[str], references: Sequence[Sequence[str]]
) -> tuple[list[str], list[list[str]]]:
    """Validated predictions and references, one line each, empty references dropped."""
    if len(predictions) != len(references):
        raise ValueError(
            f"Got {len(predictions)} predictions but {len(references)} reference lists; "
            "give one prediction and one list of references per unique input."
        )
    if not predictions:
        raise ValueError("No inputs to score.")
    clean_predictions = [_one_line(p, f"predictions[{i}]") for i, p in enumerate(predictions)]
    clean_references = []
    for i, refs in enumerate(references):
        if isinstance(refs, str):
            raise TypeError(f"references[{i}] is a string; it must be a list of references.")
        kept = [r for r in (_one_line(r, f"references[{i}]") for r in refs) if r]
        if not kept:
            raise ValueError(
                f"Input {i} has no non-empty reference; references are required for every input."
            )
        clean_references.append(kept)
    return clean_predictions, clean_references


def _one_line(text: str, where: str) -> str:
    """``text`` with every line break (anything str.splitlines splits on) made a space."""
    if not isinstance(text, str):
        raise TypeError(f"{where} must be str, got {type(text).__name__}.")
    return " ".join(text.splitlines()).strip()
