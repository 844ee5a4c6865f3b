"""The Adidas case study (notebook 09): style words, domain-word coverage, the token
probabilities of Figure 4, and the automatic stand-in for the paper's preference study.
Every number comes from stored runs of the main Adidas table (``runner.run_table``)."""
from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from .. import analysis
from ..harness.profile import Profile
from ..report import verdicts
from ..report.claims import n_seeds, record_claim
from ..report.stats import pair_by_seed

COVERAGE_RULE = (
    "Domain-word coverage as the paper counts it (token share: occurrences of the top-50 domain words over all "
    "content words, pooled over outputs). Per seed, the Plugin's outputs against the base's (Zeroshot), a paired "
    "bootstrap over test inputs of the pooled share (p = share of resamples where the Plugin's is not higher; "
    "integer counts, compared exactly). Reproduced: the mean share over seeds is higher and p < "
    f"{verdicts.ALPHA} in most seeds; direction only: higher without that; not reproduced: not higher."
)
PREFERENCE_RULE = (
    "Proxy judge, not human raters: per test product the output closer to the reference by sentence-embedding "
    "similarity wins (ROUGE-L judge reported beside it). Per seed, the Plugin against ICL-3, a two-sided exact "
    "binomial (sign) test of wins against losses at 50%, ties left out. Reproduced: the mean share of wins over "
    f"seeds is above 50% and, in most seeds, p < {verdicts.ALPHA} with more wins than losses; direction only: "
    "above 50% without that; not reproduced: not above 50%."
)
PREFERENCE_JUDGE = "embedding"


def by_method(records: Sequence[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for record in records:
        grouped.setdefault(record["method"], []).append(record)
    return grouped


def coverage_table(records: Sequence[dict], words: pd.DataFrame) -> pd.DataFrame:
    """Domain-word coverage of each method's outputs, every reading, mean over seeds."""
    rows = []
    for method, runs in by_method(records).items():
        for run in runs:
            rows.append({"method": method, "seed": run["seed"], **analysis.coverage_readings(run["predictions"], words)})
    frame = pd.DataFrame(rows)
    return frame.groupby("method", sort=False)[list(analysis.COVERAGE_READINGS)].mean()


def style_word_figure(words: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(12, 3.6))
    sns.barplot(data=words, x="word", y="count", ax=ax, color=sns.color_palette()[0])
    ax.tick_params(axis="x", rotation=70)
    ax.set_xlabel("")
    ax.set_title("Top-50 words of the Adidas descriptions (stopwords removed)")
    plt.close(fig)
    return fig


def telling_steps(trace: pd.DataFrame, count: int = 3) -> list[int]:
    """The decoding steps where the Plugin moves the style words' probabilities the most."""
    shift = (trace.plugin - trace.base).abs().groupby(trace.step).sum()
    return sorted(shift.nlargest(count).index.tolist())


def trace_figure(trace: pd.DataFrame, steps: Sequence[int], top: int = 6):
    """Figure 4's bottom row: base vs Plugin probabilities of the likeliest style words."""
    fig, axes = plt.subplots(1, len(steps), figsize=(4.2 * len(steps), 3.4), squeeze=False)
    for ax, step in zip(axes[0], steps):
        at = trace[trace.step == step]
        at = at.assign(best=at[["base", "plugin"]].max(axis=1)).nlargest(top, "best")
        long = at.melt(id_vars="word", value_vars=["base", "plugin"], var_name="model", value_name="probability")
        sns.barplot(data=long, x="word", y="probability", hue="model", ax=ax)
        ax.set_title(f"step {step}: Plugin chose {at.chosen.iloc[0]!r}")
        ax.tick_params(axis="x", rotation=45)
        ax.set_xlabel("")
    fig.tight_layout()
    plt.close(fig)
    return fig


def preference_table(records: Sequence[dict], references: Sequence[Sequence[str]], a: str = "Plugin",
                     b: str = "ICL-3", seed: int = 0) -> pd.DataFrame:
    """The proxy preference of ``a`` over ``b`` per seed and judge (share with 95% CI, p-value)."""
    runs = by_method(records)
    rows = []
    for run_a in runs[a]:
        run_b = next(r for r in runs[b] if r["seed"] == run_a["seed"])
        result = analysis.preference_proxy(run_a["predictions"], run_b["predictions"], references, seed=seed)
        for judge, summary in result.items():
            rows.append({"seed": run_a["seed"], "judge": judge, **summary})
    return pd.DataFrame(rows)


def check_coverage(records: Sequence[dict], words: pd.DataFrame, n_resamples: int) -> tuple[str, str, dict]:
    """(verdict, ours, statistic) of the coverage claim under ``COVERAGE_RULE``."""
    runs = by_method(records)
    per_seed = {}
    for plugin, base in pair_by_seed(runs["Plugin"], runs["Zeroshot"]):
        hits_a, total_a = analysis.coverage_counts(plugin["predictions"], words)
        hits_b, total_b = analysis.coverage_counts(base["predictions"], words)
        per_seed[int(plugin["seed"])] = {
            "Plugin": f"{sum(hits_a)}/{sum(total_a)}", "Zeroshot": f"{sum(hits_b)}/{sum(total_b)}",
            "Plugin share": sum(hits_a) / sum(total_a) if sum(total_a) else 0.0,
            "p": verdicts.paired_bootstrap_ratio(hits_a, total_a, hits_b, total_b, n_resamples, int(plugin["seed"]))}
    plugin_share = sum(t["Plugin share"] for t in per_seed.values()) / len(per_seed)
    base_share = analysis.domain_word_coverage(runs["Zeroshot"][0]["predictions"], words)
    passing = [seed for seed, t in per_seed.items() if verdicts.significant(t["p"])]
    verdict = verdicts.verdict(plugin_share > base_share, verdicts.most(len(passing), len(per_seed)))
    n = {"inputs": len(runs["Plugin"][0]["predictions"]), "seeds": len(per_seed)}
    ps = "/".join(f"{t['p']:.3f}" for t in per_seed.values())
    statistic = {"summary": f"token share {plugin_share:.1%} vs {base_share:.1%}; bootstrap p {ps}; "
                            f"{n['inputs']} inputs, {n_seeds(n['seeds'])}",
                 "n": n, "bootstrap_resamples": int(n_resamples), "Zeroshot share": base_share,
                 "Plugin share (mean over seeds)": plugin_share, "per seed": per_seed, "seeds significant": passing}
    return verdict, f"{plugin_share:.1%} vs {base_share:.1%} (token share, mean over seeds)", statistic


def check_preference(preference: pd.DataFrame) -> tuple[str, str, dict]:
    """(verdict, ours, statistic) of the preference claim under ``PREFERENCE_RULE``, from
    ``preference_table`` (its per-seed binomial p-values)."""
    judged = preference[preference.judge == PREFERENCE_JUDGE]
    passing = [int(r.seed) for _, r in judged.iterrows() if r.wins_a > r.wins_b and verdicts.significant(r.p_value)]
    share = float(judged.share_a.mean())
    verdict = verdicts.verdict(share > 0.5, verdicts.most(len(passing), len(judged)))
    per_seed = {f"{r.judge} seed {int(r.seed)}": {"share": r.share_a, "wins": int(r.wins_a), "losses": int(r.wins_b),
                                                  "ties": int(r.ties), "p": r.p_value}
                for _, r in preference.iterrows()}
    n = {"inputs": int(judged.n_items.iloc[0]), "seeds": len(judged)}
    statistic = {"summary": f"{share:.0%} wins ({PREFERENCE_JUDGE} judge); sign-test p "
                            + "/".join(f"{p:.3f}" for p in judged.p_value) + f"; {n['inputs']} inputs, {n_seeds(n['seeds'])}",
                 "n": n, "per seed": per_seed, "seeds significant": passing}
    ours = (f"{share:.0%} ({PREFERENCE_JUDGE} judge, mean over seeds; p < {verdicts.ALPHA} in {len(passing)} "
            f"of {n_seeds(len(judged))})")
    return verdict, ours, statistic


def record_claims(profile: Profile | str, coverage: pd.DataFrame, preference: pd.DataFrame,
                  records: Sequence[dict], words: pd.DataFrame, n_resamples: int) -> list[dict]:
    """Verdicts for the domain-word coverage (``COVERAGE_RULE``; ``coverage``: ``coverage_table``,
    kept for its readings) and the preference study (``PREFERENCE_RULE``)."""
    verdict, ours, statistic = check_coverage(records, words, n_resamples)
    claims = [record_claim(
        profile, "adidas_coverage", "Adidas: Plugin's outputs use more of the top-50 domain words than the base's",
        "25.6% vs 13.8%", ours, verdict, rule=COVERAGE_RULE,
        statistic={**statistic, "readings (mean over seeds)": coverage.loc[["Plugin", "Zeroshot"]].to_dict(orient="index")})]
    verdict, ours, statistic = check_preference(preference)
    claims.append(record_claim(
        profile, "adidas_preference", "Adidas: Plugin's outputs are preferred over ICL-3's (closer to the reference)",
        "81% of 100 (human raters)", ours, verdict, rule=PREFERENCE_RULE, statistic=statistic))
    return claims
