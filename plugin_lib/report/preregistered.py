"""The preregistered confirmation: every claim's rule, written and frozen in git before any
confirmatory number existed (``report.freeze`` names the commit; ``tests/test_preregistration.py``
fails if this file, the ``confirm`` profile or the frozen test inputs differ from that commit, or
if a confirmatory result entered git before it).

What is fixed here, and why:

- **Tests.** Every comparison of two systems is a *two-level (hierarchical) paired bootstrap*:
  a draw resamples the seeds with replacement, then, for each drawn seed, the test inputs with
  replacement; both systems are scored on the same drawn inputs (a deterministic system, such
  as Zeroshot, has one run that pairs with every seed). The statistic is the mean over the
  drawn seeds of the corpus-metric difference (A minus B), rescored exactly from per-input
  statistics (``metrics.resample``). p-values are ``(count + 1) / (resamples + 1)``.
- **Metrics and multiplicity.** The four metrics that rescore without a Java scorer
  (``BOOTSTRAP_METRICS``) are tested; within one comparison their p-values are adjusted by
  Holm's step-down method (family-wise error ``ALPHA`` over the four). "Significant" means a
  Holm-adjusted p < ``ALPHA`` on most (three or four) of the four. "Direction" for a
  superiority claim means A's mean over seeds is higher on most (four or more) of the seven
  metrics, from the stored scores.
- **Null claims** ("more layers do not help", "the Plugin is as good as LoRA") get tests with
  the margins in ``MARGINS``, stated here before any number: non-superiority (A is not better
  than B by ``margin`` or more: the share of draws with difference >= margin) or equivalence
  (TOST: the larger of the two one-sided p-values), never non-significance.
- **Premises** come first; a claim whose premise fails is "not measurable at this scale":
  BDPL must have learned (``bdpl_learned``), fine-tuning must have improved the base for the
  base-quality claim, and the shift base must be biased against the target among the outputs
  that the judge counts (``biased_against_target``).
- **Verdicts**: reproduced (direction and significant), direction only, not reproduced, not
  measurable at this scale (``report.verdicts``' vocabulary). A claim over several comparisons
  (every baseline, every base, every deeper model) takes the weakest of them.

The glue that finds the runs for each role is ``experiments.confirmation``; it changes no rule.
Nothing here reads files: plain records and numbers in, verdicts out.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from scipy import stats as scipy_stats

from ..metrics import METRIC_NAMES
from ..metrics.resample import InputStatistics

ALPHA = 0.05
RESAMPLES = 2000  # draws of every bootstrap below
BOOTSTRAP_SEED = 0
BOOTSTRAP_METRICS = ("BLEU", "ROUGE-1", "ROUGE-2", "NIST")
# Margins of the null claims, per bootstrap metric, in the metric's own units: about 5% of the
# offline base's Plugin scores on E2E (BLEU ~0.2, ROUGE-1/2 ~0.4-0.6 and ~0.3, NIST ~4).
MARGINS = {"BLEU": 0.01, "ROUGE-1": 0.02, "ROUGE-2": 0.02, "NIST": 0.2}
# BDPL has learned in a seed when its chosen prompt is not empty, beats the empty prompt on
# hyper-validation by at least this mean log-likelihood per reference token, and its
# distribution has left uniform: some position's largest probability is at least twice 1/C.
BDPL_MIN_GAIN = 0.01
BDPL_MIN_CONCENTRATION = 2.0
# Decoding FLOPs: the Plugin's over LoRA's must stay below this ratio (exact counts).
FLOPS_MARGIN = 1.05
THEOREM_RATE = -1.0

REPRODUCED = "reproduced"
DIRECTION_ONLY = "direction only"
NOT_REPRODUCED = "not reproduced"
NOT_MEASURABLE = "not measurable at this scale"
_STRENGTH = {REPRODUCED: 2, DIRECTION_ONLY: 1, NOT_REPRODUCED: 0}


def most(count: int, total: int) -> bool:
    """More than half, in integers."""
    return total > 0 and 2 * int(count) > int(total)


def verdict(direction: bool, significant: bool) -> str:
    if not direction:
        return NOT_REPRODUCED
    return REPRODUCED if significant else DIRECTION_ONLY


def weakest(verdicts: Sequence[str]) -> str:
    """All must hold: the weakest; a premise failure anywhere makes the whole not measurable."""
    if not verdicts or NOT_MEASURABLE in verdicts:
        return NOT_MEASURABLE
    return min(verdicts, key=_STRENGTH.__getitem__)


# ---------------------------------------------------------------- the tests


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (family-wise over the given tests)."""
    order = sorted(p_values, key=p_values.get)
    m, running, adjusted = len(order), 0.0, {}
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * p_values[key]))
        adjusted[key] = running
    return {key: adjusted[key] for key in p_values}


def _p(count: int, resamples: int) -> float:
    return (int(count) + 1) / (resamples + 1)


def hierarchical_draws(n_seeds: int, n_inputs: int, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(seed index per draw and slot: resamples x n_seeds; how often each input is drawn in
    that slot: resamples x n_seeds x n_inputs). Seeds first, then inputs within each."""
    if n_seeds < 1 or n_inputs < 1:
        raise ValueError(f"Need at least one seed and one input, got {n_seeds} and {n_inputs}.")
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, n_seeds, (resamples, n_seeds))
    draws = rng.integers(0, n_inputs, (resamples * n_seeds, n_inputs))
    counts = np.zeros((resamples * n_seeds, n_inputs), dtype=np.int64)
    np.add.at(counts, (np.arange(resamples * n_seeds)[:, None], draws), 1)
    return seeds, counts.reshape(resamples, n_seeds, n_inputs)


def _pair_by_seed(runs_a: Sequence[Mapping], runs_b: Sequence[Mapping]) -> list[tuple[Mapping, Mapping]]:
    """A's runs in seed order, each with B's run of the same seed (B's only run when B is
    deterministic). Both must be on the same test inputs, in the same order."""
    if not runs_a or not runs_b:
        raise ValueError("A comparison needs runs of both systems.")
    by_seed = {r["seed"]: r for r in runs_b}
    pairs = []
    for run in sorted(runs_a, key=lambda r: r["seed"]):
        other = runs_b[0] if len(runs_b) == 1 else by_seed.get(run["seed"])
        if other is None:
            raise ValueError(f"B has no run of seed {run['seed']}.")
        if list(run["test_ids"]) != list(other["test_ids"]):
            raise ValueError(f"Seed {run['seed']}: the two systems' runs are not on the same test inputs.")
        pairs.append((run, other))
    return pairs


def compare(runs_a: Sequence[Mapping], runs_b: Sequence[Mapping], references: Sequence[Sequence[str]],
            *, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """A against B: the effect on the seven metrics (A's mean over its runs minus B's, stored
    scores), and per bootstrap metric the observed difference and its hierarchical-bootstrap
    draws (``hierarchical_draws``). Runs are records with ``seed``, ``metrics``,
    ``predictions`` and ``test_ids``; ``references`` follow the test ids' order."""
    pairs = _pair_by_seed(runs_a, runs_b)
    n_inputs = len(references)
    if any(len(r["predictions"]) != n_inputs for pair in pairs for r in pair):
        raise ValueError(f"Every run needs one prediction per reference ({n_inputs}).")
    seeds, counts = hierarchical_draws(len(pairs), n_inputs, resamples, seed)
    full = np.ones((1, n_inputs), dtype=np.int64)
    scored: dict[int, InputStatistics] = {}

    def statistics(run: Mapping) -> InputStatistics:
        if id(run) not in scored:
            scored[id(run)] = InputStatistics(run["predictions"], references, BOOTSTRAP_METRICS)
        return scored[id(run)]

    draws = {m: np.zeros((resamples, len(pairs))) for m in BOOTSTRAP_METRICS}
    observed = {m: [] for m in BOOTSTRAP_METRICS}
    for k, (run, other) in enumerate(pairs):
        a, b = statistics(run), statistics(other)
        whole_a, whole_b = a.scores(full), b.scores(full)
        for m in BOOTSTRAP_METRICS:
            observed[m].append(float(whole_a[m][0] - whole_b[m][0]))
        slots = seeds == k
        if slots.any():
            drawn = counts[slots]
            sa, sb = a.scores(drawn), b.scores(drawn)
            for m in BOOTSTRAP_METRICS:
                draws[m][slots] = sa[m] - sb[m]
    used_b = list({id(other): other for _, other in pairs}.values())
    effect = {m: float(np.mean([r["metrics"][m] for r, _ in pairs]) - np.mean([r["metrics"][m] for r in used_b]))
              for m in METRIC_NAMES}
    return {"effect": effect, "difference": {m: float(np.mean(v)) for m, v in observed.items()},
            "draws": {m: v.mean(axis=1) for m, v in draws.items()},
            "seeds": [int(r["seed"]) for r, _ in pairs], "n_inputs": n_inputs, "resamples": resamples}


def superiority(comparison: Mapping) -> dict:
    """"A is better than B": one-sided p per bootstrap metric (draws with difference <= 0),
    Holm-adjusted over the four; direction on most of the seven metrics; significant on most
    of the four."""
    resamples = comparison["resamples"]
    raw = {m: _p((d <= 0).sum(), resamples) for m, d in comparison["draws"].items()}
    adjusted = holm(raw)
    significant = [m for m in BOOTSTRAP_METRICS if adjusted[m] < ALPHA]
    ahead = [m for m in METRIC_NAMES if comparison["effect"][m] > 0]
    ci = {m: [float(q) for q in np.percentile(d, [2.5, 97.5])] for m, d in comparison["draws"].items()}
    return {"verdict": verdict(most(len(ahead), len(METRIC_NAMES)), most(len(significant), len(BOOTSTRAP_METRICS))),
            "ahead on": ahead, "significant on": significant, "p": raw, "p (Holm)": adjusted, "ci95": ci,
            **_n(comparison)}


def non_superiority(comparison: Mapping, margins: Mapping[str, float] = MARGINS) -> dict:
    """"A is not better than B" (deeper models do not help): per bootstrap metric, p = share
    of draws with difference >= margin, Holm-adjusted. Reproduced: below ``ALPHA`` on most of
    the four. Not reproduced: A is significantly better (``superiority`` reproduced), or its
    mean difference reaches the margin on most of the four. Otherwise direction only."""
    resamples = comparison["resamples"]
    raw = {m: _p((d >= margins[m]).sum(), resamples) for m, d in comparison["draws"].items()}
    adjusted = holm(raw)
    shown = [m for m in BOOTSTRAP_METRICS if adjusted[m] < ALPHA]
    better = superiority(comparison)
    reaching = [m for m in BOOTSTRAP_METRICS if comparison["difference"][m] >= margins[m]]
    if better["verdict"] == REPRODUCED or most(len(reaching), len(BOOTSTRAP_METRICS)):
        result = NOT_REPRODUCED
    else:
        result = REPRODUCED if most(len(shown), len(BOOTSTRAP_METRICS)) else DIRECTION_ONLY
    ci90 = {m: [float(q) for q in np.percentile(d, [5, 95])] for m, d in comparison["draws"].items()}
    return {"verdict": result, "margins": dict(margins), "not better by the margin on": shown,
            "p": raw, "p (Holm)": adjusted, "superiority p (Holm)": better["p (Holm)"], "ci90": ci90,
            **_n(comparison)}


def equivalence(comparison: Mapping, margins: Mapping[str, float] = MARGINS) -> dict:
    """"A is as good as B" (Plugin and LoRA): TOST per bootstrap metric, p = the larger of the
    shares of draws with difference >= margin and <= -margin, Holm-adjusted. Reproduced:
    below ``ALPHA`` on most of the four. Not reproduced: either system is significantly better
    (``superiority`` either way reproduced), or the mean difference lies outside the margin on
    most of the four. Otherwise direction only."""
    resamples = comparison["resamples"]
    raw = {m: max(_p((d >= margins[m]).sum(), resamples), _p((d <= -margins[m]).sum(), resamples))
           for m, d in comparison["draws"].items()}
    adjusted = holm(raw)
    shown = [m for m in BOOTSTRAP_METRICS if adjusted[m] < ALPHA]
    flipped = {**comparison, "effect": {m: -v for m, v in comparison["effect"].items()},
               "draws": {m: -d for m, d in comparison["draws"].items()}}
    either = superiority(comparison)["verdict"] == REPRODUCED or superiority(flipped)["verdict"] == REPRODUCED
    outside = [m for m in BOOTSTRAP_METRICS if abs(comparison["difference"][m]) >= margins[m]]
    if either or most(len(outside), len(BOOTSTRAP_METRICS)):
        result = NOT_REPRODUCED
    else:
        result = REPRODUCED if most(len(shown), len(BOOTSTRAP_METRICS)) else DIRECTION_ONLY
    ci90 = {m: [float(q) for q in np.percentile(d, [5, 95])] for m, d in comparison["draws"].items()}
    return {"verdict": result, "margins": dict(margins), "equivalent on": shown, "p": raw, "p (Holm)": adjusted,
            "ci90": ci90, **_n(comparison)}


def _n(comparison: Mapping) -> dict:
    return {"difference": comparison["difference"], "effect": comparison["effect"],
            "n": {"inputs": comparison["n_inputs"], "seeds": len(comparison["seeds"])}}


def ratio_compare(counts_a: Sequence[tuple[Sequence[int], Sequence[int]]],
                  counts_b: Sequence[tuple[Sequence[int], Sequence[int]]],
                  *, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """A pooled share (sum of numerators over sum of denominators, per seed) of A against B's,
    by the same two-level bootstrap: ``counts_a`` holds per seed the per-input (numerators,
    denominators); B has one entry per seed or one for all (deterministic). A share with no
    denominator is 0. One-sided p: draws where A's share is not above B's. Reproduced: A's mean
    share is higher and p < ``ALPHA``; direction only: higher; else not reproduced."""
    if len(counts_b) not in (1, len(counts_a)):
        raise ValueError("B needs one count list per seed of A, or one for all.")
    pairs = [(a, counts_b[0] if len(counts_b) == 1 else counts_b[k]) for k, a in enumerate(counts_a)]
    n_inputs = len(pairs[0][0][0])
    arrays = [[np.asarray(x, dtype=np.int64) for x in (*a, *b)] for a, b in pairs]
    if any(len(x) != n_inputs for pair in arrays for x in pair):
        raise ValueError("Every count list must have one entry per test input.")
    seeds, counts = hierarchical_draws(len(pairs), n_inputs, resamples, seed)

    def share(num: np.ndarray, den: np.ndarray) -> np.ndarray:
        return np.divide(num, den, out=np.zeros(num.shape, dtype=float), where=den > 0)

    draws = np.zeros((resamples, len(pairs)))
    observed_a, observed_b = [], []
    for k, (na, da, nb, db) in enumerate(arrays):
        observed_a.append(float(share(np.array(na.sum()), np.array(da.sum()))))
        observed_b.append(float(share(np.array(nb.sum()), np.array(db.sum()))))
        slots = seeds == k
        if slots.any():
            c = counts[slots]
            draws[slots] = share(c @ na, c @ da) - share(c @ nb, c @ db)
    mean_draws = draws.mean(axis=1)
    p = _p((mean_draws <= 0).sum(), resamples)
    higher = float(np.mean(observed_a)) > float(np.mean(observed_b))
    return {"verdict": verdict(higher, p < ALPHA), "share A per seed": observed_a, "share B per seed": observed_b,
            "difference": float(np.mean(observed_a) - np.mean(observed_b)), "p": p,
            "ci95": [float(q) for q in np.percentile(mean_draws, [2.5, 97.5])],
            "n": {"inputs": n_inputs, "seeds": len(pairs)}}


def sign_test_over_inputs(outcomes_per_seed: Sequence[Sequence[int]]) -> dict:
    """A pairwise preference (A's output judged better: +1, worse: -1, tie: 0), per seed and
    test input. Per input, the mean over seeds; an exact two-sided sign test of those means
    (zeros left out), so each input counts once. Reproduced: more inputs favour A and
    p < ``ALPHA``; direction only: more favour A; else not reproduced."""
    per_input = np.asarray(outcomes_per_seed, dtype=float).mean(axis=0)
    wins, losses = int((per_input > 0).sum()), int((per_input < 0).sum())
    p = float(scipy_stats.binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else 1.0
    return {"verdict": verdict(wins > losses, p < ALPHA), "inputs favouring A": wins, "inputs favouring B": losses,
            "ties": int(per_input.size - wins - losses), "p": p,
            "n": {"inputs": int(per_input.size), "seeds": len(outcomes_per_seed)}}


def narrower_spread(values: Mapping[str, Mapping[str, Sequence[float]]], system: str) -> dict:
    """``system`` has the narrowest spread over seeds: per metric and rival, a one-sided F test
    of the rival's variance over ``system``'s (df: seeds - 1 each), Holm-adjusted over the seven
    metrics per rival. Direction: the smallest standard deviation on most of the seven;
    significant: against every rival, adjusted p < ``ALPHA`` on most of the seven. Fewer
    than two seeds: not measurable."""
    seeds = min(len(v) for per_metric in values.values() for v in per_metric.values())
    if seeds < 2:
        return {"verdict": NOT_MEASURABLE, "n": {"seeds": seeds}}
    std = {s: {m: float(np.std(values[s][m], ddof=1)) for m in METRIC_NAMES} for s in values}
    narrowest = [m for m in METRIC_NAMES if min(std, key=lambda s: std[s][m]) == system]
    rivals = [s for s in values if s != system]
    adjusted, passing = {}, {}
    for rival in rivals:
        raw = {}
        for m in METRIC_NAMES:
            ours, theirs = std[system][m] ** 2, std[rival][m] ** 2
            raw[m] = (1.0 if theirs == 0 else 0.0) if ours == 0 else float(
                scipy_stats.f.sf(theirs / ours, len(values[rival][m]) - 1, len(values[system][m]) - 1))
        adjusted[rival] = holm(raw)
        passing[rival] = [m for m in METRIC_NAMES if adjusted[rival][m] < ALPHA]
    significant = all(most(len(passing[r]), len(METRIC_NAMES)) for r in rivals)
    return {"verdict": verdict(most(len(narrowest), len(METRIC_NAMES)), significant), "std": std,
            "narrowest on": narrowest, "F p (Holm)": adjusted, "n": {"seeds": seeds}}


# ---------------------------------------------------------------- premises


def bdpl_learned(prompts: Sequence[Mapping]) -> dict:
    """BDPL's premise, on hyper-validation only: in most seeds its chosen prompt is not empty,
    beats the empty prompt by ``BDPL_MIN_GAIN`` (mean log-likelihood per reference token), and
    its distribution has left uniform (a position's largest probability >= ``BDPL_MIN_CONCENTRATION``
    / C). ``prompts``: the stored prompt records (``prefix``, ``hyper_reward``,
    ``hyper_reward_no_prefix``, ``top_probs``, ``bdpl.num_candidates``), one per seed."""
    per_seed = []
    for p in prompts:
        gain = float(p["hyper_reward"]) - float(p["hyper_reward_no_prefix"])
        concentration = max(p["top_probs"]) * p["bdpl"]["num_candidates"]
        per_seed.append({"seed": p.get("seed"), "prefix": p["prefix"], "gain": gain, "concentration": concentration,
                         "learned": bool(p["prefix"]) and gain >= BDPL_MIN_GAIN
                         and concentration >= BDPL_MIN_CONCENTRATION})
    holds = most(sum(s["learned"] for s in per_seed), len(per_seed))
    return {"holds": holds, "per seed": per_seed}


def biased_against_target(target: int, counted: int, reference_target: int, reference_counted: int) -> dict:
    """The shift premise: among the outputs the judge counts (CommonGen: gendered ones; WebNLG:
    all), the fine-tuned base's target share is below the test references' share, by a
    one-sided exact binomial test at the references' share (p < ``ALPHA``)."""
    if counted == 0 or reference_counted == 0:
        return {"holds": False, "p": 1.0, "share": None, "reference share": None}
    share0 = reference_target / reference_counted
    p = float(scipy_stats.binomtest(int(target), int(counted), share0, alternative="less").pvalue)
    return {"holds": p < ALPHA, "p": p, "share": target / counted, "reference share": share0,
            "n": {"counted": int(counted), "reference counted": int(reference_counted)}}


def improves_base(comparison: Mapping) -> dict:
    """Base-quality premise: the fine-tuned base alone beats the original base alone
    (``superiority`` reproduced)."""
    result = superiority(comparison)
    return {"holds": result["verdict"] == REPRODUCED, **result}


# ---------------------------------------------------------------- the claims


@dataclass(frozen=True)
class Claim:
    """One confirmatory claim: its key (the exploratory claim's, so both sit side by side), the
    notebook, the claim, the test, the roles A and B (``experiments.confirmation`` finds their
    runs), the premise and the scope."""

    key: str
    notebook: str
    claim: str
    test: str
    a: str = "Plugin"
    b: tuple[str, ...] = ()
    premise: str | None = None
    dataset: str = "e2e"
    scope: str = "paper"
    rule: str = field(default="", compare=False)


_MAIN_BASELINES = ("Zeroshot", "ICL-1", "ICL-3", "NewModel", "WeightedComb", "TempNet")
_SUPERIORITY = ("two-level paired bootstrap (seeds, then inputs; {r} draws) per bootstrap metric, Holm over the "
                "four; reproduced: A's mean higher on most of the seven metrics and Holm-adjusted p < {a} on most "
                "of the four; direction only: higher on most of the seven; else not reproduced").format(r=RESAMPLES,
                                                                                                     a=ALPHA)

TESTS = {
    "superiority": "A against each B: " + _SUPERIORITY + ". With several B, the weakest verdict.",
    "non-superiority": ("each A (every deeper model) against B (one layer): non-superiority at the margins "
                        f"{MARGINS} (p = share of draws with difference >= margin, Holm over the four); reproduced "
                        "when shown on most of the four for every A; not reproduced when some A is significantly "
                        "better (superiority rule) or its mean difference reaches the margin on most of the four; "
                        "else direction only."),
    "equivalence": (f"TOST at the margins {MARGINS} on the two-level bootstrap, Holm over the four; reproduced: "
                    "shown on most of the four; not reproduced: either is significantly better, or the mean "
                    "difference lies outside the margin on most of the four; else direction only."),
    "ratio": ("A's pooled share against B's (per seed: sum of counts over inputs), two-level bootstrap, one-sided "
              f"p; reproduced: higher and p < {ALPHA}; direction only: higher."),
    "sign": ("pairwise judge per input and seed (+1/-1/0), mean over seeds per input, exact two-sided sign test "
             f"over inputs; reproduced: more inputs favour A and p < {ALPHA}; direction only: more favour A."),
    "spread": ("standard deviation over seeds, one-sided F test against each rival, Holm over the seven metrics; "
               "reproduced: narrowest on most of the seven and significant against every rival on most."),
    "flops": f"exact FLOP counts: the Plugin's decoding FLOPs over LoRA's below {FLOPS_MARGIN} (reproduced) or not.",
    "rate": (f"the 95% bootstrap-over-seeds interval of the excess-loss slope on log t contains {THEOREM_RATE:g} or "
             "lies below it (reproduced), else not reproduced; on seeds no exploratory run used."),
}
PREMISES = {
    "bdpl learned": ("BDPL learned (``bdpl_learned``): in most seeds its chosen prompt is non-empty, beats the "
                     f"empty prompt on hyper-validation by >= {BDPL_MIN_GAIN} nats per token, and some position's "
                     f"top probability is >= {BDPL_MIN_CONCENTRATION}/C"),
    "bdpl learned at the learning budget": ("the same, at the smallest of the profile's bdpl_learning_budgets "
                                            "at which seed 0 learns (chosen on hyper-validation only)"),
    "fine-tuning improves the base": ("the longest fine-tuned base alone beats the original base alone "
                                      "(superiority rule)"),
    "shift base biased": ("the fine-tuned base's target share among the judge's counted outputs is below the test "
                          f"references' share (one-sided exact binomial, p < {ALPHA})"),
}

CLAIMS: tuple[Claim, ...] = (
    *(Claim(f"main_{d}", n, f"{d}: the Plugin beats every baseline", "superiority", b=_MAIN_BASELINES, dataset=d)
      for d, n in (("e2e", "01"), ("webnlg", "02"), ("commongen", "03"), ("adidas", "04"))),
    Claim("table5_plugin_vs_bdpl", "05", "Plugin beats BDPL (75 calls)", "superiority", b=("BDPL",),
          premise="bdpl learned"),
    Claim("table5_bdpl_plugin", "05", "BDPL + Plugin beats BDPL (75 calls)", "superiority", a="BDPL+Plugin",
          b=("BDPL",), premise="bdpl learned"),
    Claim("table5_bdpl_plugin_vs_plugin", "05", "BDPL + Plugin beats the Plugin alone (75 calls)", "superiority",
          a="BDPL+Plugin", b=("Plugin",), premise="bdpl learned"),
    Claim("table5_plugin_vs_bdpl_learning", "05", "Plugin beats BDPL at a budget where BDPL learns", "superiority",
          b=("BDPL@learning",), premise="bdpl learned at the learning budget", scope="beyond"),
    Claim("table5_bdpl_plugin_learning", "05", "BDPL + Plugin beats BDPL at a budget where BDPL learns",
          "superiority", a="BDPL+Plugin@learning", b=("BDPL@learning",), premise="bdpl learned at the learning budget",
          scope="beyond"),
    Claim("table5_bdpl_plugin_vs_plugin_learning", "05", "BDPL + Plugin beats the Plugin at a budget where BDPL learns",
          "superiority", a="BDPL+Plugin@learning", b=("Plugin",), premise="bdpl learned at the learning budget",
          scope="beyond"),
    Claim("base_quality_e2e_0", "06", "the Plugin improves as the base improves (longest fine-tuned base against "
          "the original)", "superiority", a="Plugin@longest-finetuned", b=("Plugin@original",),
          premise="fine-tuning improves the base"),
    Claim("base_quality_e2e_1", "06", "the Plugin beats the base alone on every base", "superiority",
          a="Plugin@every-base", b=("Zeroshot@every-base",)),
    Claim("complexity_e2e_0", "07", "one layer improves on the base", "superiority", b=("Zeroshot",)),
    Claim("complexity_e2e_1", "07", "more layers do not help", "non-superiority", a="Plugin-deeper",
          b=("Plugin",)),
    Claim("complexity_e2e_2", "07", "pretrained initialisation helps (against random init of the same depth)",
          "superiority", a="Plugin-pretrained", b=("Plugin-same-depth",)),
    Claim("architecture_e2e_0", "08", "the transformer layer beats the MLP and the linear model", "superiority",
          b=("Plugin-MLP", "Plugin-linear")),
    Claim("architecture_e2e_1", "08", "the transformer layer has the narrowest bands over seeds", "spread",
          b=("Plugin-MLP", "Plugin-linear")),
    Claim("adidas_coverage", "09", "the Plugin's outputs use more domain words than the base's", "ratio",
          b=("Zeroshot",), dataset="adidas"),
    Claim("adidas_preference", "09", "the Plugin's outputs are preferred over ICL-3's (embedding judge)", "sign",
          b=("ICL-3",), dataset="adidas"),
    Claim("shift_webnlg", "10", "WebNLG: the Plugin shifts the biased base towards Person-related text", "ratio",
          b=("Zeroshot@shift-base",), premise="shift base biased", dataset="webnlg"),
    Claim("shift_commongen", "10", "CommonGen: the Plugin shifts the biased base towards woman-related text",
          "ratio", b=("Zeroshot@shift-base",), premise="shift base biased", dataset="commongen"),
    Claim("table8_lora_gap", "11", "the Plugin is as good as LoRA", "equivalence", b=("LoRA",)),
    Claim("table8_flops", "11", "the Plugin's decoding costs under 5% more FLOPs than LoRA's", "flops"),
    *(Claim(f"topk_e2e_residual_top-{k}", "12", f"top-{k} view: the Plugin beats Zeroshot", "superiority",
            b=("Zeroshot",), scope="beyond") for k in (5, 20, 100)),
    Claim("theorem1", "13", "excess loss falls at least as fast as 1/t", "rate", scope="beyond"),
)


def claim(key: str) -> Claim:
    for c in CLAIMS:
        if c.key == key:
            return c
    raise ValueError(f"No preregistered claim {key!r}; known: {[c.key for c in CLAIMS]}.")


def rule_text(c: Claim) -> str:
    """The claim's rule in words, as the report shows it."""
    text = TESTS[c.test]
    if c.premise:
        text = f"Premise: {PREMISES[c.premise]}; if it fails, not measurable at this scale. Then: {text}"
    return text


def judge_comparisons(c: Claim, comparisons: Sequence[Mapping]) -> dict:
    """The verdict of a superiority, non-superiority or equivalence claim from its comparisons
    (``compare`` results, one per B or per base): the weakest of them."""
    test = {"superiority": superiority, "non-superiority": non_superiority, "equivalence": equivalence}[c.test]
    results = [test(comparison) for comparison in comparisons]
    return {"verdict": weakest([r["verdict"] for r in results]), "comparisons": results}


def flops_verdict(plugin_flops: int, lora_flops: int) -> str:
    """Exact integers: plugin / lora < FLOPS_MARGIN, compared as fractions."""
    margin = Fraction(str(FLOPS_MARGIN))
    return REPRODUCED if Fraction(int(plugin_flops), int(lora_flops)) < margin else NOT_REPRODUCED


def rate_verdict(ci_low: float, ci_high: float) -> str:
    if math.isnan(ci_low) or math.isnan(ci_high):
        return NOT_MEASURABLE
    return REPRODUCED if ci_low <= THEOREM_RATE else NOT_REPRODUCED
