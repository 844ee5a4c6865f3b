"""A base model seen through an API that returns only the top-k log-probabilities per step.

The paper assumes the closed model exposes its whole next-token distribution b_t. Real APIs
return the log-probabilities of the k most likely tokens only (often k = 5 or 20).
``TopKBlackBox`` wraps a ``BlackBoxLM`` so that everything downstream (the base-output cache,
Zeroshot, the Plugin's logits processor, beam search) sees exactly that, with the tokens
outside the top k filled in by one of two rules:

- ``"residual"`` (the default): the top-k log-probabilities are kept exactly as the API gives
  them, and the missing mass 1 - sum(top-k probabilities) is spread uniformly over the other
  V - k tokens. This is the least committal completion of what the API reports: it adds no
  information about the unreported tokens beyond their total mass, and never reorders tokens
  (each unreported token gets at most the k-th probability, since their average cannot exceed
  it). The reweighting model can still promote an unreported token, and every training target
  keeps a finite loss.
- ``"renormalize"``: -inf outside the top k, the top k renormalised to sum to 1. Then no token
  outside the top k can ever be produced, by Zeroshot or by the Plugin (b_t * r_t = 0 for
  every r_t), and a training target outside the top k has infinite loss. Training on this
  view leaves such targets out (``reachable_plugin_log_probs``): they are tokens the decoding
  model cannot produce, so the model is fitted on the ones it can.

The default is ``residual`` because it uses the reported numbers unchanged and keeps the Plugin
what the paper makes it, a reweighting of the base over the whole vocabulary.

The views are loaded by name: ``load_base_model("smollm2-135m-instruct@top20")`` (default
rule), ``"...@top20-renormalize"``, or ``"...@topall"`` (every log-probability: the control for
"log-probabilities instead of logits", which matters because the repetition penalty divides a
positive logit but multiplies a log-probability). ``config.model_spec`` of such a name is the
base's spec with the suffix in its name, so runs are stored under their own folder.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from .base_model import BlackBoxLM
from .metrics import METRIC_NAMES
from .train import BaseOutputCache, EncodedPair, plugin_log_probs

RULES = ("residual", "renormalize")
DEFAULT_RULE = "residual"
_SUFFIX = re.compile(r"top(all|\d+)(?:-(\w+))?")


def restrict_log_probs(scores: torch.Tensor, k: int | None, rule: str = DEFAULT_RULE) -> torch.Tensor:
    """What a top-k API returns for next-token ``scores`` (..., V): log-probabilities, in the
    dtype of ``scores``, with the tokens outside the top k filled in by ``rule``.

    For k = None or k >= V every log-probability is returned (an API without a top-k limit).
    """
    _check(k, rule)
    log_p = F.log_softmax(scores.float(), dim=-1)
    vocab = log_p.shape[-1]
    if k is None or k >= vocab:
        return log_p.to(scores.dtype)
    top, index = log_p.topk(k, dim=-1)
    kept = top.logsumexp(-1, keepdim=True)  # log of the top-k mass
    if rule == "renormalize":
        top, fill = top - kept, torch.full_like(kept, -math.inf)
    else:
        # log((1 - exp(kept)) / (V - k)); -expm1 stays exact when the top k hold almost all the
        # mass, and the clamp turns a rounding overshoot into an empty residual (-inf).
        fill = (-torch.expm1(kept)).clamp(min=0).log() - math.log(vocab - k)
    out = log_p.copy_(fill.expand_as(log_p))  # reuse the buffer: (B, T, V) is large
    return out.scatter_(-1, index, top).to(scores.dtype)


def _check(k: int | None, rule: str) -> None:
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"k must be a positive integer or None (all tokens), got {k!r}")
    if rule not in RULES:
        raise ValueError(f"Unknown top-k rule {rule!r}; choose one of {RULES}.")


class TopKBlackBox(BlackBoxLM):
    """``base`` as a top-k log-probability API: ``logits`` and ``generate`` expose per position
    the top-k log-probabilities and, elsewhere, what ``rule`` says (see the module docstring).
    """

    def __init__(self, base: BlackBoxLM, k: int | None, rule: str = DEFAULT_RULE, name: str | None = None):
        _check(k, rule)
        # The view runs the very same frozen model; only what leaves it changes.
        super().__init__(base._model, base.tokenizer, name or f"{base.name}@top{k or 'all'}-{rule}")
        self.k, self.rule = k, rule

    def restrict(self, scores: torch.Tensor) -> torch.Tensor:
        return restrict_log_probs(scores, self.k, self.rule)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The API's log-probabilities (B, T, V) for every position (normalised: any
        log_softmax downstream leaves them unchanged)."""
        return self.restrict(super().logits(input_ids, attention_mask))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        """transformers' ``generate`` on the API's view.

        The restriction is applied to the model's output, so it comes before every logits
        processor, warper and beam-search score. A processor put first in ``logits_processor``
        would not be: generate runs the processors it builds from its own arguments
        (``repetition_penalty=``, ``min_new_tokens=``, ...) before the ones it is given. The
        repetition penalty therefore acts on log-probabilities, as it must with a real API.
        """
        handle = self._model.register_forward_hook(self._restrict_output)
        try:
            return super().generate(input_ids, attention_mask, **kwargs)
        finally:
            handle.remove()

    def _restrict_output(self, _module, _inputs, output):
        output.logits = self.restrict(output.logits)
        return output

    def __repr__(self) -> str:
        return f"TopKBlackBox({self.name!r}, k={self.k}, rule={self.rule!r}, vocab_size={self.vocab_size})"


def parse_model_name(name: str) -> tuple[str, int | None, str] | None:
    """``"base@top20-renormalize"`` -> ``("base", 20, "renormalize")``; without a rule, the
    default rule; ``"base@topall"`` -> ``("base", None, ...)``, every log-probability (the
    control that separates "log-probabilities instead of logits" from "only the top k").
    None for a name without a suffix (or an existing local path).
    """
    base, at, suffix = name.rpartition("@")
    if not at or Path(name).exists():
        return None
    match = _SUFFIX.fullmatch(suffix)
    k = None if match is None or match[1] == "all" else int(match[1])
    rule = (match and match[2]) or DEFAULT_RULE
    if not base or match is None or k == 0 or rule not in RULES:
        raise ValueError(
            f"Unknown model-name suffix '@{suffix}' in {name!r}. Use '@top<k>' (k >= 1, rule "
            f"{DEFAULT_RULE!r}), '@top<k>-<rule>' with rule one of {RULES}, or '@topall', e.g. "
            "'smollm2-135m-instruct@top20-renormalize'."
        )
    return base, k, rule


def reachable_plugin_log_probs(base_log_probs: torch.Tensor, small_logits: torch.Tensor) -> torch.Tensor:
    """The Plugin's training log-probabilities on a view that rules tokens out (-inf).

    A target the base rules out cannot be produced by any reweighting, so it is left out of the
    loss: its log-probability reads 0 (no loss, no gradient) instead of -inf. Pass it as
    ``TokenObjective(log_probs=...)``. The objective still divides by every target token, so a
    left-out token counts as a zero in the mean loss: a batch's gradient shrinks by its share of
    reachable targets, which Adam's normalisation largely absorbs. On a view without -inf
    (residual, full vocabulary) it equals ``plugin_log_probs``.
    """
    return plugin_log_probs(base_log_probs, small_logits).masked_fill(torch.isneginf(base_log_probs), 0.0)


def reference_coverage(cache: BaseOutputCache, pairs: Sequence[EncodedPair], ks: Sequence[int]) -> dict[int, float]:
    """Share of the target tokens of ``pairs`` that the base (``cache``, built on the full
    vocabulary) ranks among its top k, for each k: the targets a top-k API would report."""
    hits = np.zeros(len(ks))
    total = 0
    for i, pair in enumerate(pairs):
        rows = cache.get([i]).float()
        targets = torch.tensor(pair.input_ids[pair.prompt_length:])
        ranks = (rows > rows.gather(1, targets[:, None])).sum(1)  # tokens strictly more likely
        hits += [(ranks < k).sum().item() for k in ks]
        total += len(targets)
    return {k: hits[j] / total for j, k in enumerate(ks)}


# ---------------------------------------------------------------- the ablation's table and figure

FULL_LABEL, ALL_LABEL = "full logits", "all log-probs"


def view_label(model_name: str) -> str:
    """"top-20" for a top-k view, "all log-probs" for ``@topall``, "full logits" for the base."""
    view = parse_model_name(model_name)
    if view is None:
        return FULL_LABEL
    return ALL_LABEL if view[1] is None else f"top-{view[1]}"


def _x_order(label: str) -> tuple[int, int]:
    """Narrowest view first, then all log-probabilities, then the full base (right-most)."""
    if label.startswith("top-"):
        return 0, int(label.removeprefix("top-"))
    return (1, 0) if label == ALL_LABEL else (2, 0)


def plot_metric_vs_k(summary: pd.DataFrame, title: str = ""):
    """One panel per metric: mean (error bars: std over seeds) per view, one line per method,
    views from the narrowest top k to the full base. ``summary`` is ``tables.summarize`` of runs
    whose ``model`` column holds ``view_label``s."""
    import matplotlib.pyplot as plt

    views = sorted(summary.index.unique("model"), key=_x_order)
    fig, axes = plt.subplots(2, 4, figsize=(14, 7))
    for ax, metric in zip(axes.flat, METRIC_NAMES):
        for method, block in summary.groupby(level="method", sort=False):
            block = block.droplevel("method").reindex(views)
            ax.errorbar(range(len(views)), block[metric], yerr=block[f"{metric}_std"].fillna(0),
                        marker="o", capsize=3, label=method)
        ax.set_title(metric)
        ax.set_xticks(range(len(views)), views, rotation=40, ha="right")
    legend_ax = axes.flat[-1]
    legend_ax.axis("off")
    legend_ax.legend(*axes.flat[0].get_legend_handles_labels(), loc="center", title="method")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    plt.close(fig)
    return fig



def plugin_gaps(summary: pd.DataFrame) -> pd.DataFrame:
    """Per view: the Plugin's mean minus Zeroshot's on each metric, and on how many of the
    seven metrics the Plugin is ahead. ``summary`` as for ``plot_metric_vs_k``."""
    views = sorted(summary.index.unique("model"), key=_x_order)
    gaps = pd.DataFrame({metric: [summary.loc[(v, "Plugin"), metric] - summary.loc[(v, "Zeroshot"), metric]
                                  for v in views] for metric in METRIC_NAMES},
                        index=pd.Index(views, name="view"))
    gaps["Plugin ahead on"] = (gaps[list(METRIC_NAMES)] > 0).sum(axis=1)
    return gaps


def record_claims(gaps: pd.DataFrame, dataset: str, rule: str, profile: str) -> list[dict]:
    """One verdict per top-k view: the Plugin still beats Zeroshot on most metrics.

    Not a claim of the paper (which assumes full logits), but the question a user of a top-k
    API asks; stored with the paper's claims so REPORT.md shows it beside them.
    """
    from .report import majority_verdict, record_claim

    entries = []
    for view, row in gaps.iterrows():
        if not str(view).startswith("top-"):
            continue
        ahead = int(row["Plugin ahead on"])
        entries.append(record_claim(
            profile, f"topk_{dataset}_{rule}_{view}",
            f"{dataset}, {view} log-probs ({rule}): the Plugin beats Zeroshot on most metrics",
            "beyond the paper (it assumes full logits)",
            f"Plugin ahead on {ahead}/{len(METRIC_NAMES)}; BLEU gap {row['BLEU']:+.4f}, ROUGE-L gap {row['ROUGE-L']:+.4f}",
            majority_verdict(ahead, len(METRIC_NAMES))))
    return entries
