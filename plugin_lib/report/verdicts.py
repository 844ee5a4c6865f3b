"""The verdict vocabulary and the statistical tests behind it. No experiment knowledge: plain
numbers in, p-values, intervals and verdicts out.

A claim gets exactly one of four verdicts (issue 16):

- **reproduced**: the paper's direction, and a test passes: p < ``ALPHA`` in most seeds (paired
  bootstrap over test inputs, or an exact McNemar or Fisher test for counts), or a
  t-interval over seeds that excludes no effect;
- **direction only**: the paper's direction, but not significant at this scale;
- **not reproduced**: not the paper's direction;
- **not measurable at this scale**: the experiment's premise does not hold here.

"Most" always means more than half (``most``): 2 of 3 seeds is most, 2 of 4 is not; 4 of 7
metrics is most, 3 of 7 is not.

Knife edges: a statistic that is a ratio of small integers is never compared with a float
threshold. Bootstrap p-values are ``(count + 1) / (resamples + 1)``, one correctly rounded
division, so p = 1/20 equals the float 0.05 and fails ``p < 0.05``; binomial p-values with
success probability 1/2 have a power of two as denominator and can never equal 0.05; pooled
ratios are compared by cross-multiplying integers (``paired_bootstrap_ratio``); Spearman's rho
is computed with exact rational arithmetic (``spearman_exact``).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

import numpy as np
from scipy import stats as scipy_stats

ALPHA = 0.05

REPRODUCED = "reproduced"
DIRECTION_ONLY = "direction only"
NOT_REPRODUCED = "not reproduced"
NOT_MEASURABLE = "not measurable at this scale"
VERDICTS = (REPRODUCED, DIRECTION_ONLY, NOT_REPRODUCED, NOT_MEASURABLE)


# ---------------------------------------------------------------- counting


def most(count: int, total: int) -> bool:
    """More than half: ``2 * count > total`` (integers, no float threshold)."""
    return total > 0 and 2 * int(count) > int(total)


def significant(p: float, alpha: float = ALPHA) -> bool:
    """p < alpha, strictly (p exactly 0.05 is not significant); NaN is not significant."""
    return bool(p < alpha)  # NaN < alpha is False


def passes_in_most_seeds(p_values: Sequence[float], alpha: float = ALPHA) -> bool:
    """The test passes (p < alpha) in more than half of the seeds."""
    return most(sum(significant(p, alpha) for p in p_values), len(p_values))


def metrics_passing(p_per_seed: Mapping[str, Sequence[float]], alpha: float = ALPHA) -> list[str]:
    """The metrics whose test passes in most seeds."""
    return [metric for metric, ps in p_per_seed.items() if passes_in_most_seeds(ps, alpha)]


def passes_on_most_metrics(p_per_seed: Mapping[str, Sequence[float]], alpha: float = ALPHA) -> bool:
    """On more than half of the metrics, the test passes in most seeds."""
    return most(len(metrics_passing(p_per_seed, alpha)), len(p_per_seed))


def ahead_on_most(effects: Mapping[str, float]) -> bool:
    """The effect (A minus B) is positive on more than half of the metrics."""
    return most(sum(bool(e > 0) for e in effects.values()), len(effects))


# ---------------------------------------------------------------- verdicts


def verdict(direction: bool, significant: bool) -> str:
    """reproduced (direction and significant), direction only, or not reproduced."""
    if not direction:
        return NOT_REPRODUCED
    return REPRODUCED if significant else DIRECTION_ONLY


_STRENGTH = {REPRODUCED: 2, DIRECTION_ONLY: 1, NOT_REPRODUCED: 0}


def weakest(verdicts: Iterable[str]) -> str:
    """The weakest of several verdicts that must all hold (e.g. one per base model);
    "not measurable at this scale" only when none of them was measurable."""
    measured = [v for v in verdicts if v != NOT_MEASURABLE]
    if not measured:
        return NOT_MEASURABLE
    return min(measured, key=_STRENGTH.__getitem__)


def majority_verdict(verdicts: Iterable[str]) -> str:
    """Over several cases (e.g. datasets) of which most must hold: reproduced when most are
    reproduced, direction only when most at least show the direction, else not reproduced.
    Cases that were not measurable are left out."""
    measured = [v for v in verdicts if v != NOT_MEASURABLE]
    if not measured:
        return NOT_MEASURABLE
    if most(sum(v == REPRODUCED for v in measured), len(measured)):
        return REPRODUCED
    if most(sum(v in (REPRODUCED, DIRECTION_ONLY) for v in measured), len(measured)):
        return DIRECTION_ONLY
    return NOT_REPRODUCED


# ---------------------------------------------------------------- tests on counts


def _binomial_half(k: int, n: int) -> float:
    """Two-sided exact binomial test of k successes in n trials against 1/2; 1 when n = 0."""
    return float(scipy_stats.binomtest(int(k), int(n), 0.5).pvalue) if n else 1.0


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """Exact McNemar test of two paired binary outcomes (one pair per test input): the
    two-sided binomial test of the discordant pairs against 1/2.

    ``a_only``: pairs where only A holds; ``b_only``: only B. p = 1 without discordant pairs.
    """
    if len(a) != len(b):
        raise ValueError(f"McNemar needs paired outcomes, got {len(a)} and {len(b)}.")
    a_only = sum(bool(x) and not bool(y) for x, y in zip(a, b))
    b_only = sum(bool(y) and not bool(x) for x, y in zip(a, b))
    return {"a": int(sum(map(bool, a))), "b": int(sum(map(bool, b))), "a_only": a_only, "b_only": b_only,
            "n_pairs": len(a), "p": _binomial_half(a_only, a_only + b_only)}


def two_proportion_exact(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Fisher's exact two-sided test of k_a/n_a against k_b/n_b (unpaired outcomes);
    1 when either group is empty."""
    if n_a == 0 or n_b == 0:
        return 1.0
    return float(scipy_stats.fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]]).pvalue)


def paired_bootstrap_ratio(num_a: Sequence[int], den_a: Sequence[int], num_b: Sequence[int],
                           den_b: Sequence[int], n_resamples: int = 1000, seed: int = 0) -> float:
    """One-sided p that A's pooled ratio sum(num_a) / sum(den_a) is not above B's, by a paired
    bootstrap over items (the same resample for both): (resamples with A <= B, + 1) / (n + 1).

    Integer counts; the ratios are compared by cross-multiplying, never as floats. A ratio
    with a zero denominator counts as 0.
    """
    arrays = [np.asarray(x, dtype=np.int64) for x in (num_a, den_a, num_b, den_b)]
    n = len(arrays[0])
    if any(len(x) != n for x in arrays) or n == 0:
        raise ValueError("paired_bootstrap_ratio needs four equally long, non-empty count lists.")
    idx = np.random.default_rng(seed).integers(0, n, (n_resamples, n))
    na, da, nb, db = (x[idx].sum(axis=1) for x in arrays)
    # A <= B  <=>  na / da <= nb / db, with x / 0 read as 0.
    not_better = np.where((da > 0) & (db > 0), na * db <= nb * da, np.where(da > 0, na <= 0, True))
    return (int(not_better.sum()) + 1) / (n_resamples + 1)


# ---------------------------------------------------------------- intervals over seeds


def t_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
    """Mean and the two-sided t-interval over seeds (ddof = 1); low and high are NaN with
    fewer than two values (one seed cannot be significant)."""
    x = np.asarray(values, dtype=float)
    n = int(x.size)
    mean = float(x.mean()) if n else float("nan")
    if n < 2:
        return {"mean": mean, "low": float("nan"), "high": float("nan"), "n": n}
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


# ---------------------------------------------------------------- rank correlation, exactly


def average_ranks(values: Sequence[float]) -> list[Fraction]:
    """Ranks 1..n, tied values sharing their average rank, as exact fractions (scipy's
    ``rankdata``: an average rank is a whole or half number, which a float holds exactly)."""
    return [Fraction(float(r)) for r in scipy_stats.rankdata(list(values), method="average")]


def _exact_sqrt(q: Fraction) -> Fraction | None:
    num, den = math.isqrt(q.numerator), math.isqrt(q.denominator)
    return Fraction(num, den) if num * num == q.numerator and den * den == q.denominator else None


def spearman_exact(x: Sequence[float], y: Sequence[float]) -> Fraction | float:
    """Spearman's rho without rounding error.

    Without ties it is 1 - 6 * sum(d^2) / (n (n^2 - 1)) over integer rank differences d, a
    Fraction (one swap of neighbours among 4 points: exactly 4/5). With ties it is Pearson's r
    of the average ranks: a Fraction when its denominator is a rational square, else the
    nearest float. NaN when either side is constant or has fewer than two points.
    """
    if len(x) != len(y):
        raise ValueError(f"spearman_exact needs paired values, got {len(x)} and {len(y)}.")
    n = len(x)
    if n < 2:
        return float("nan")
    rx, ry = average_ranks(list(x)), average_ranks(list(y))
    if len(set(rx)) == n and len(set(ry)) == n:
        d2 = sum((a - b) ** 2 for a, b in zip(rx, ry))
        return 1 - Fraction(6) * d2 / (n * (n * n - 1))
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return float("nan")
    root = _exact_sqrt(sxx * syy)
    return sxy / root if root is not None else float(sxy) / math.sqrt(sxx * syy)


def format_fraction(value: Fraction | float) -> str:
    """"4/5 (0.800)" for a fraction, "0.812" for a float, "nan" for NaN."""
    if isinstance(value, Fraction):
        return str(value) if value.denominator == 1 else f"{value} ({float(value):.3f})"
    return f"{value:.3f}"
