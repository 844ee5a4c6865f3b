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
from ..report.claims import record_claim


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


def record_claims(profile: Profile | str, coverage: pd.DataFrame, preference: pd.DataFrame) -> list[dict]:
    """Verdicts for the domain-word coverage and the preference study."""
    plugin, base = coverage.loc["Plugin", "token_share"], coverage.loc["Zeroshot", "token_share"]
    claims = [record_claim(
        profile, "adidas_coverage", "Adidas: Plugin's outputs use more of the top-50 domain words than the base's",
        "25.6% vs 13.8%", f"{plugin:.1%} vs {base:.1%} (token share, mean over seeds)",
        "reproduced" if plugin > base else "not reproduced")]
    embedding = preference[preference.judge == "embedding"]
    won = int((embedding.ci_low > 0.5).sum())
    claims.append(record_claim(
        profile, "adidas_preference", "Adidas: Plugin's outputs are preferred over ICL-3's (closer to the reference)",
        "81% of 100 (human raters)",
        f"{embedding.share_a.mean():.0%} (embedding judge, mean over seeds; the 95% CI lies above "
        f"50% in {won} of {len(embedding)} seeds)",
        "reproduced" if won * 2 > len(embedding) else "not reproduced"))
    return claims
