"""The second preregistered wave (issue 45): the paper's claims that had no row, at CPU scale.

Written and committed on 2026-11-27, in a commit of its own, before any of its runs existed:
no BDPL, LoRA or deeper-reweighting-model run on WebNLG, CommonGen or Adidas existed by then, in
the ``confirm`` profile or at any other scale in this repository (``results/local`` has them on
E2E only), and ``report.freeze`` checks that every wave-2 result entered git after it. This file is frozen from
that commit on, like ``report.preregistered`` (wave 1), whose tests, margins and vocabulary it
reuses unchanged.

What wave 2 judges, on the ``confirm`` profile's frozen test inputs (200 per dataset, 3 seeds,
SmolLM2-135M-Instruct, the profile's settings unchanged), for each of WebNLG, CommonGen, Adidas:

- Table 5 (the paper's three claims, BDPL at the profile's 75 calls): the Plugin beats BDPL;
  BDPL + Plugin beats BDPL; BDPL + Plugin beats the Plugin alone. Premise: BDPL learned on that
  dataset (wave 1's rule), else not measurable at this scale.
- Table 8's LoRA rows: the Plugin is as good as LoRA (wave 1's equivalence test and margins).
- Figure 3's trend: more layers (2, 4 and 8) do not help (wave 1's non-superiority test and
  margins; each depth against the 1-layer Plugin, each searching its own hyperparameters).

One rule is new, as issue 45 asks of any rule written from now on: **a significant deficit
disqualifies "direction only"**. A superiority comparison whose B is significantly better than
A on any bootstrap metric (one-sided p of "B better", ``(#{draws >= 0} + 1) / (R + 1)``, Holm over
the four bootstrap metrics, below ``ALPHA``, and its 95% interval below zero) is "not reproduced"
where the wave-1 test would say "direction only". A "reproduced" comparison keeps its verdict,
and the deficit is shown beside it (``report.mixed``).

A row of the README per group (Table 5, Table 8's LoRA rows, Figure 3's trend) gets the weakest
verdict of its measurable claims (the paper states each on every dataset), with the count of
claims behind it; "not measurable at this scale" only when none is measurable.

Not run at CPU scale (rows that say so, ``report.paper_rows``): Figure 2's trend on the three
(fine-tuned bases), Figure 3's 12-layer and pretrained variants on the three, and Table 5 at
the budgets where BDPL learns.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .preregistered import (ALPHA, BOOTSTRAP_METRICS, DIRECTION_ONLY, MARGINS, NOT_MEASURABLE, NOT_REPRODUCED,
                            PREMISES, TESTS, Claim, _p, equivalence, holm, non_superiority, superiority, weakest)

WAVE = 2
DATASETS = ("webnlg", "commongen", "adidas")
LAYERS = (2, 4, 8)  # the deeper reweighting models run at CPU scale (12 and pretrained: paper only)
GROUPS = {
    "table5": "Table 5: BDPL + Plugin beats BDPL, the Plugin beats BDPL, BDPL + Plugin beats the Plugin",
    "table8_lora": "Table 8's LoRA rows: the Plugin is as good as LoRA",
    "complexity": "Figure 3's trend: more layers (2, 4, 8) do not help",
}


def deficits(comparison: Mapping) -> dict[str, float]:
    """The bootstrap metrics on which B is significantly better than A (``compare``'s draws of
    A - B), with their Holm-adjusted one-sided p."""
    resamples = comparison["resamples"]
    raw = {m: _p((np.asarray(d) >= 0).sum(), resamples) for m, d in comparison["draws"].items()}
    adjusted = holm(raw)
    upper = {m: float(np.percentile(d, 97.5)) for m, d in comparison["draws"].items()}
    return {m: adjusted[m] for m in BOOTSTRAP_METRICS if m in adjusted and adjusted[m] < ALPHA and upper[m] < 0}


def superiority_without_deficit(comparison: Mapping) -> dict:
    """Wave 1's superiority test, where a significant deficit disqualifies "direction only"."""
    result = superiority(comparison)
    behind = deficits(comparison)
    result["behind on"] = behind
    if result["verdict"] == DIRECTION_ONLY and behind:
        result["verdict"] = NOT_REPRODUCED
        result["why"] = "direction only by the wave-1 test, but significantly behind on " + ", ".join(behind)
    return result


TEST_FUNCTIONS = {"superiority": superiority_without_deficit, "non-superiority": non_superiority,
                  "equivalence": equivalence}

CLAIMS: tuple[Claim, ...] = tuple(
    claim
    for d in DATASETS
    for claim in (
        Claim(f"wave2_table5_plugin_vs_bdpl_{d}", "05", f"{d}: the Plugin beats BDPL (75 calls)", "superiority",
              b=("BDPL",), premise="bdpl learned", dataset=d),
        Claim(f"wave2_table5_bdpl_plugin_{d}", "05", f"{d}: BDPL + Plugin beats BDPL (75 calls)", "superiority",
              a="BDPL+Plugin", b=("BDPL",), premise="bdpl learned", dataset=d),
        Claim(f"wave2_table5_bdpl_plugin_vs_plugin_{d}", "05", f"{d}: BDPL + Plugin beats the Plugin alone (75 calls)",
              "superiority", a="BDPL+Plugin", b=("Plugin",), premise="bdpl learned", dataset=d),
        Claim(f"wave2_table8_lora_gap_{d}", "11", f"{d}: the Plugin is as good as LoRA", "equivalence", b=("LoRA",),
              dataset=d),
        Claim(f"wave2_complexity_{d}", "07", f"{d}: more layers (2, 4, 8) do not help", "non-superiority",
              a="Plugin-deeper", b=("Plugin",), dataset=d),
    )
)


def group(c: Claim) -> str:
    """The README row a claim belongs to (a key of ``GROUPS``)."""
    return next(g for g in GROUPS if c.key.startswith(f"wave2_{g}"))


def claim(key: str) -> Claim:
    for c in CLAIMS:
        if c.key == key:
            return c
    raise ValueError(f"No wave-2 claim {key!r}; known: {[c.key for c in CLAIMS]}.")


def deeper_labels() -> list[str]:
    """The run labels of the deeper models, each compared with the 1-layer Plugin."""
    return [f"Plugin-{k}L" for k in LAYERS]


def rule_text(c: Claim) -> str:
    text = TESTS[c.test]
    if c.test == "superiority":
        text += (" Wave 2: a significant deficit (B better on a bootstrap metric, one-sided Holm p < "
                 f"{ALPHA} with its 95% interval below zero) makes 'direction only' 'not reproduced'.")
    if c.test in ("non-superiority", "equivalence"):
        text += f" Margins {dict(MARGINS)} (wave 1's)."
    if c.premise:
        text = f"Premise: {PREMISES[c.premise]}; if it fails, not measurable at this scale. Then: {text}"
    return text


def judge_comparisons(c: Claim, comparisons: Sequence[Mapping]) -> dict:
    """The verdict of a claim from its comparisons (``preregistered.compare``): the weakest."""
    results = [TEST_FUNCTIONS[c.test](comparison) for comparison in comparisons]
    return {"verdict": weakest([r["verdict"] for r in results]), "comparisons": results}


def row_verdict(verdicts: Sequence[str]) -> str:
    """A README row's verdict from its claims' verdicts: the weakest of the measurable ones."""
    measurable = [v for v in verdicts if v != NOT_MEASURABLE]
    return weakest(measurable) if measurable else NOT_MEASURABLE
