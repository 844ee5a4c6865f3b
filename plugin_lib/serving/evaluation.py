"""Does the Plugin help on my data? The adapted model against its base alone, on held-out pairs.

``evaluate(plugin, pairs)`` decodes every prompt twice, with the artifact's decoding settings:
with the Plugin, and with the base alone (the same prompt format, repetition penalty and token
limits; ``base_only_outputs``). Each output is scored against the pair's completion with the
package's metrics (BLEU, ROUGE-1, ROUGE-2 and NIST, as ``plugin_lib.metrics`` computes them, so
the numbers are the paper tables', on their 0-1 scales; ROUGE-L too where Java runs), sacrebleu's
BLEU and chrF on their 0-100 scales (with their signatures), exact match, and the outputs' form:
mean length in words against the references', and the shares of empty outputs and of outputs
that reached the token limit. A paired bootstrap over the pairs (the same draws for both
systems, ``resamples`` of them) gives every difference a 95% percentile interval. Each row
names its implementation and scale (``METRICS``). ``plugin-repro evaluate`` prints the table,
stores it as ``evaluation.json`` in the artifact and adds it, with the file evaluated on, to the
model card.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

from ..core.decode import generate
from ..metrics import java
from ..metrics.resample import InputStatistics, resample_counts
from ..utils.io import atomic_write_json, atomic_write_text
from .artifact import PluginModel
from .inputs import Pair

PACKAGE_METRICS = ("BLEU", "ROUGE-1", "ROUGE-2", "NIST")
# What each row of the table is: its implementation and scale (the model card prints them).
METRICS = {
    "BLEU": "plugin_lib.metrics (the paper's, as the E2E scorer), 0-1",
    "ROUGE-1": "plugin_lib.metrics (rouge_score F1), 0-1",
    "ROUGE-2": "plugin_lib.metrics (rouge_score F1), 0-1",
    "ROUGE-L": "plugin_lib.metrics (coco-caption, PTB-tokenised), 0-1",
    "NIST": "plugin_lib.metrics (mteval-v13a), 0 and up",
    "sacreBLEU": "sacrebleu BLEU, 0-100",
    "chrF": "sacrebleu chrF, 0-100",
    "exact match": "output equal to the reference (whitespace-trimmed), share 0-1",
    "output/reference length": "mean words of the outputs over the references', ratio",
    "empty": "share of empty outputs, 0-1",
    "at the token limit": "share of outputs whose re-tokenised length reaches max_new_tokens, 0-1",
}
EVALUATION_FILE = "evaluation.json"
SECTION = "## Evaluation"


def base_only_outputs(plugin: PluginModel, prompts: Sequence[str], *, max_new_tokens: int | None = None,
                      progress: bool = False) -> list[str]:
    """The base alone on ``prompts``, decoded as the adapted model decodes them (greedy)."""
    d = plugin.decoding
    texts = [plugin.format_prompt(p) for p in prompts]
    plugin.check_prompt_lengths(texts)
    return generate(plugin.base, texts, None, max_new_tokens=max_new_tokens or d.max_new_tokens,
                    repetition_penalty=d.repetition_penalty, progress=progress)


class _Sacrebleu:
    """A sacrebleu corpus metric of resampled corpora: its per-sentence statistics, summed per
    draw. The two underscored methods are the ones sacrebleu's own paired bootstrap calls
    (``sacrebleu.significance``); a test checks the whole corpus against ``corpus_score``."""

    def __init__(self, metric, predictions: Sequence[str], references: Sequence[str]):
        self.metric = metric
        self.stats = np.asarray(self.metric._extract_corpus_statistics(list(predictions), [list(references)]))

    def scores(self, counts: np.ndarray) -> np.ndarray:
        summed = counts @ self.stats
        return np.array([self.metric._compute_score_from_stats(list(row)).score for row in summed])


def _form(outputs: Sequence[str], references: Sequence[str], token_counts: Sequence[int], limit: int
          ) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """Per-input (numerators, denominators or None) of the table's form rows: a draw's value is
    ``counts @ numerators / counts @ denominators`` (or ``/ n``)."""
    words = np.array([len(o.split()) for o in outputs], dtype=float)
    return {"exact match": (np.array([o.strip() == r.strip() for o, r in zip(outputs, references)], float), None),
            "output/reference length": (words, np.array([len(r.split()) for r in references], dtype=float)),
            "empty": (np.array([not o.strip() for o in outputs], dtype=float), None),
            "at the token limit": (np.array([n >= limit for n in token_counts], dtype=float), None)}


def _ratio(counts: np.ndarray, numerators: np.ndarray, denominators: np.ndarray | None) -> np.ndarray:
    bottom = counts @ denominators if denominators is not None else counts.sum(axis=1)
    return (counts @ numerators) / np.maximum(bottom, 1e-12)


def evaluate(plugin: PluginModel, pairs: Sequence[Pair], *, resamples: int = 1000, seed: int = 0,
             max_new_tokens: int | None = None, progress: bool = False) -> dict:
    """The Plugin against the base alone on ``pairs``, both decoded in process (:func:`score`)."""
    if len(pairs) < 2:
        raise ValueError(f"evaluate needs at least 2 pairs to resample; got {len(pairs)}.")
    prompts = [p.prompt for p in pairs]
    overrides = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
    adapted = plugin.generate(prompts, progress=progress, **overrides)
    alone = base_only_outputs(plugin, prompts, max_new_tokens=max_new_tokens, progress=progress)
    return score(adapted, alone, [p.completion for p in pairs], plugin.base.tokenizer,
                 limit=max_new_tokens or plugin.decoding.max_new_tokens, resamples=resamples, seed=seed,
                 head_dtype=plugin.head_dtype)


def score(adapted: Sequence[str], alone: Sequence[str], references: Sequence[str], tokenizer, *, limit: int,
          resamples: int = 1000, seed: int = 0, head_dtype: str = "float32", engine: str = "package") -> dict:
    """The two systems' outputs against ``references``: per metric both scores, the difference
    and its paired-bootstrap 95% interval; ``n``, the resamples, and both systems' outputs.
    ``limit``: the decoding's max_new_tokens (the "at the token limit" row); ``engine``: what decoded."""
    if len(references) < 2:
        raise ValueError(f"evaluate needs at least 2 pairs to resample; got {len(references)}.")
    metrics = PACKAGE_METRICS + (("ROUGE-L",) if java.has_java() else ())
    full = np.ones((1, len(references)), dtype=np.int64)
    draws = resample_counts(len(references), resamples, seed)
    scores, signatures = {}, {}
    for name, outputs in (("plugin", adapted), ("base", alone)):
        package = InputStatistics(outputs, [[r] for r in references], metrics)
        corpus = {"sacreBLEU": _Sacrebleu(BLEU(), outputs, references), "chrF": _Sacrebleu(CHRF(), outputs, references)}
        signatures = {m: str(c.metric.get_signature()) for m, c in corpus.items()}
        tokens = [len(tokenizer(o, add_special_tokens=False).input_ids) for o in outputs]
        form = _form(outputs, references, tokens, limit)
        scores[name] = {
            "whole": {**{m: float(v[0]) for m, v in package.scores(full).items()},
                      **{m: float(c.scores(full)[0]) for m, c in corpus.items()},
                      **{m: float(_ratio(full, *parts)[0]) for m, parts in form.items()}},
            "draws": {**package.scores(draws), **{m: c.scores(draws) for m, c in corpus.items()},
                      **{m: _ratio(draws, *parts) for m, parts in form.items()}}}
    table = {}
    for metric in scores["plugin"]["whole"]:
        difference = scores["plugin"]["draws"][metric] - scores["base"]["draws"][metric]
        plugin_score, base_score = scores["plugin"]["whole"][metric], scores["base"]["whole"][metric]
        table[metric] = {"plugin": plugin_score, "base": base_score, "difference": plugin_score - base_score,
                         "ci95": [float(q) for q in np.percentile(difference, [2.5, 97.5])],
                         "measures": METRICS[metric]}
    found = {"metrics": table, "n": len(references), "resamples": resamples, "seed": seed, "head_dtype": head_dtype,
             "max_new_tokens": limit, "signatures": signatures, "outputs": {"plugin": list(adapted), "base": list(alone)}}
    return found if engine == "package" else {**found, "engine": engine}


def markdown(result: dict) -> str:
    """The evaluation as a Markdown table (the model card's section and the command's output)."""
    head = result.get("head_dtype", "float32")
    source = result.get("data", {}).get("file")
    lines = [f"On {result['n']} held-out pairs" + (f" ({source})" if source else "")
             + f"; paired bootstrap over the pairs ({result['resamples']} draws), 95% interval of the difference."
             + ("" if head == "float32" else f" The Plugin decoded with a {head} output layer.")
             + (f" Both decoded in {result['engine']}." if result.get("engine") else ""), "",
             "| metric | what it measures, scale | Plugin | base alone | difference | 95% CI |",
             "| --- | --- | --- | --- | --- | --- |"]
    for metric, row in result["metrics"].items():
        lines.append(f"| {metric} | {row.get('measures', '')} | {row['plugin']:.4g} | {row['base']:.4g} | "
                     f"{row['difference']:+.4g} | {row['ci95'][0]:+.4g} to {row['ci95'][1]:+.4g} |")
    signatures = result.get("signatures", {})
    if signatures:
        lines += ["", "sacrebleu signatures: " + "; ".join(f"{m} `{sig}`" for m, sig in signatures.items()) + "."]
    return "\n".join(lines) + "\n"


def write_to_artifact(directory, result: dict) -> None:
    """``evaluation.json`` (the numbers and both systems' outputs) and an "Evaluation" section in
    the model card (README.md), each written whole; an earlier evaluation's section is replaced."""
    directory = Path(directory)
    atomic_write_json(directory / EVALUATION_FILE, result)
    card = directory / "README.md"
    text = card.read_text(encoding="utf-8") if card.exists() else ""
    start = text.find(SECTION)
    if start >= 0:  # the section ends where the next one begins
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + (text[end + 1:] if end >= 0 else "")
    section = f"{SECTION}\n\n{markdown(result)}\n"
    use = text.find("## Use")
    text = text[:use] + section + text[use:] if use >= 0 else text + "\n" + section
    atomic_write_text(card, text)
