"""A verdict that hides a significant deficit is shown as mixed (the verdict itself is unchanged).

A frozen rule may call a comparison "direction only" because A's mean is higher on most of the
seven metrics while B is significantly better on some: Adidas, Plugin against NewModel, is behind
on BLEU and ROUGE-2. Wherever a verdict is shown (README, REPORT.md), ``flag`` puts those
deficits beside it: every paired bootstrap comparison of the claim (superiority of A over B,
``preregistered.compare``) is read the other way, "B better than A", per bootstrap metric.

The stored one-sided p of "A better" is ``(#{draws with difference <= 0} + 1) / (R + 1)``; the
reverse is ``(#{difference >= 0} + 1) / (R + 1)``, which is ``1 - p + 1/(R + 1)`` when no draw
is exactly 0 (continuous corpus statistics). Holm adjusts over the claim comparison's metrics, as
the rules do, and a metric counts as a deficit only where the adjusted reverse p is below
``ALPHA`` *and* its 95% interval lies below zero, which also bounds the share of tied draws.

An equivalence or non-superiority comparison stores no one-sided p of "A better" (its p is
TOST's): the judge keeps, beside its result, the metrics on which B is significantly better,
computed from the comparison's bootstrap draws by the same standard (``behind on``,
:func:`note_deficits`), and ``flag`` reads them too (issue 60: the Adidas LoRA claim, direction
only, hid a significant ROUGE-1 deficit).

A notebook's own rule (``experiments.main_tables``) stores per metric the effect against the best
other method and one bootstrap p per seed: there a metric is a deficit where the effect is
negative and the reverse p is below ``ALPHA`` in most seeds, the notebook rule's own standard.
``record_claim`` stores the flag with every claim (``mixed``), so a notebook shows it too.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .preregistered import ALPHA, BOOTSTRAP_METRICS, RESAMPLES, _p, holm, most
from .preregistered_wave2 import deficits as draw_deficits


def _dicts(statistic):
    """Every dict in a claim's statistic, at any depth (depth first, in order)."""
    if isinstance(statistic, dict):
        yield statistic
        for value in statistic.values():
            yield from _dicts(value)
    elif isinstance(statistic, list):
        for value in statistic:
            yield from _dicts(value)


def comparisons(statistic) -> list[dict]:
    """Every paired bootstrap comparison in a claim's statistic (per-metric ``p`` and ``ci95``)."""
    return [d for d in _dicts(statistic) if isinstance(d.get("p"), dict) and isinstance(d.get("ci95"), dict)]


def _with_deficits(statistic) -> list[dict]:
    """The comparisons a flag reads: those with their deficits from the draws (``behind on``),
    and the stored superiority comparisons (``p`` and ``ci95``) of claims judged before that."""
    return [d for d in _dicts(statistic) if isinstance(d.get("behind on"), dict) or isinstance(d.get("ahead on"), dict)
            or (isinstance(d.get("p"), dict) and isinstance(d.get("ci95"), dict))]


def deficits(comparison: dict) -> dict[str, float]:
    """The metrics on which B is significantly better than A, with their Holm-adjusted p."""
    p, ci = comparison["p"], comparison["ci95"]
    reverse = holm({m: min(1.0, 1.0 - float(v) + 1.0 / (RESAMPLES + 1)) for m, v in p.items()})
    return {m: reverse[m] for m in p if reverse[m] < ALPHA and m in ci and ci[m][1] < 0}


def seed_deficits(statistic) -> list[str]:
    """Deficits in a notebook rule's per-seed bootstraps (``{"bootstrap": {metric: {"best baseline",
    "effect", "p_per_seed"}}}`` anywhere in the statistic), as "behind X on M (p <= q in most seeds)"."""
    found = []
    for tests in (d["bootstrap"] for d in _dicts(statistic) if isinstance(d.get("bootstrap"), dict)):
        for metric, test in tests.items():
            if not isinstance(test, dict) or not isinstance(test.get("p_per_seed"), list):
                continue
            reverse = sorted(1.0 - float(p) for p in test["p_per_seed"])
            below = [r for r in reverse if r < ALPHA]
            if float(test.get("effect", 0.0)) < 0 and most(len(below), len(reverse)):
                found.append(f"behind {test.get('best baseline', 'the best baseline')} on {metric} "
                             f"(p {max(below):.3f} or less in {len(below)}/{len(reverse)} seeds)")
    return found


def advantages(comparison: Mapping) -> dict[str, float]:
    """The bootstrap metrics on which A is significantly better than B (one-sided p of "A better",
    Holm over the four, below ALPHA, and the 95% interval above zero): what contradicts a
    non-superiority claim's "A does not help"."""
    draws = comparison["draws"]
    raw = {m: _p((np.asarray(d) <= 0).sum(), comparison["resamples"]) for m, d in draws.items()}
    adjusted = holm(raw)
    lower = {m: float(np.percentile(d, 2.5)) for m, d in draws.items()}
    return {m: adjusted[m] for m in BOOTSTRAP_METRICS if m in adjusted and adjusted[m] < ALPHA and lower[m] > 0}


def note_deficits(test: str, results: Sequence[dict], compared: Sequence[Mapping]) -> None:
    """Give each judged comparison (``results``, in the order of ``compared``, the bootstrap
    comparisons they were judged on) what its verdict could hide, for every test type: for
    superiority and equivalence (A better than, or as good as, B), ``behind on``, the metrics on
    which B is significantly better; for non-superiority (A does not help), ``ahead on``, those
    on which A is. A result that has one already (wave 2's superiority) keeps it."""
    for result, comparison in zip(results, compared):
        if test == "non-superiority":
            result.setdefault("ahead on", advantages(comparison))
        else:
            result.setdefault("behind on", draw_deficits(comparison))


def flag(claim: dict) -> str:
    """"mixed: behind NewModel on BLEU, ROUGE-2 (Holm p 0.002)", or "" where nothing is behind.
    A verdict of "not reproduced" already says so, and gets no flag."""
    if claim.get("verdict") not in ("reproduced", "direction only"):
        return ""
    parts = []
    for comparison in _with_deficits(claim.get("statistic")):
        versus = str(comparison.get("versus") or "the other").removeprefix("vs ")
        ahead = comparison.get("ahead on")
        if isinstance(ahead, dict) and ahead:
            parts.append(f"{versus}: ahead on {', '.join(ahead)} (Holm p {max(ahead.values()):.3f})")
        if isinstance(ahead, dict):
            continue
        behind = comparison["behind on"] if isinstance(comparison.get("behind on"), dict) else deficits(comparison)
        if behind:
            parts.append(f"behind {versus} on {', '.join(behind)} (Holm p {max(behind.values()):.3f})")
    parts += seed_deficits(claim.get("statistic"))
    return f"mixed: {'; '.join(parts)}" if parts else ""


def group_flag(found: Mapping[str, dict], datasets: Mapping[str, str]) -> str:
    """A row of several claims (one per dataset, ``found`` by key): each flagged claim's deficits,
    named by its dataset ("mixed: adidas behind LoRA on ROUGE-1 (Holm p 0.010)"), or ""."""
    parts = [f"{datasets.get(key, key)} {flagged.removeprefix('mixed: ')}"
             for key, claim in found.items() if (flagged := flag(claim))]
    return f"mixed: {'; '.join(parts)}" if parts else ""
