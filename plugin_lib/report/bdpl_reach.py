"""Why Table 5 cannot be measured at the confirmation's BDPL budget, from its own searches.

BDPL's premise (``preregistered.bdpl_learned``, frozen) asks that some prompt position's top
probability reach ``BDPL_MIN_CONCENTRATION`` / C (C candidates; 1/C is uniform). Each stored
search (``runs/<dataset>/<base>/bdpl-prompts/seed*.json``) keeps its top probabilities after
every update; from them: how far one update moves top probability x C from 1.0, and how many
updates (and calls) that rate would need to reach the premise's threshold.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from ..utils.io import read_json
from .preregistered import BDPL_MIN_CONCENTRATION


def reach(root: Path) -> dict | None:
    """The searches' updates, calls, growth of top probability x C per update (median over
    searches) and the updates and calls that rate needs to reach the threshold; None without
    searches."""
    searches = [read_json(p) for p in sorted(Path(root).glob("runs/*/*/bdpl-prompts/seed*.json"))]
    if not searches:
        return None
    growth = [(max(s["history"][-1]["top_probs"]) * s["bdpl"]["num_candidates"] - 1.0) / len(s["history"])
              for s in searches]
    per_update = statistics.median(s["calls_used"] / len(s["history"]) for s in searches)
    rate = statistics.median(growth)
    needed = (BDPL_MIN_CONCENTRATION - 1.0) / rate if rate > 0 else float("inf")
    return {"searches": len(searches), "updates": statistics.median(len(s["history"]) for s in searches),
            "calls": statistics.median(s["calls_used"] for s in searches), "calls per update": per_update,
            "growth per update": rate, "updates needed": needed, "calls needed": needed * per_update}


# commands.confirmation_wave2.premise_ignored writes it; not in exploratory/, whose files are judged rows
WOULD_BE_FILE = "table5_premise_ignored.json"


def would_be(root: Path) -> str:
    """Wave 2's Table 5 comparisons judged with the failed premise ignored, as "A > B: k/n"
    reproduced ("" until ``plugin-repro confirmation wave2 would-be`` has written them)."""
    path = Path(root) / WOULD_BE_FILE
    if not path.exists():
        return ""
    groups: dict[str, list[str]] = {}
    for row in read_json(path)["claims"]:
        groups.setdefault(f"{row['a']} > {'/'.join(row['b'])}", []).append(row["would-be verdict"])
    return "; ".join(f"{name} {verdicts.count('reproduced')}/{len(verdicts)}" for name, verdicts in groups.items())


def line(root: Path) -> str:
    """One sentence for the README beside Table 5's "not measurable" rows ("" without searches)."""
    found = reach(root)
    if found is None:
        return ""
    ignored = would_be(root)
    return (f"Why Table 5 is not measurable: BDPL's {found['searches']} searches made {found['updates']:.0f} updates "
            f"({found['calls']:.0f} calls); top probability x C grew {found['growth per update']:.4f} an update "
            f"from 1.0; the premise asks {BDPL_MIN_CONCENTRATION:.1f}: about {found['updates needed']:,.0f} "
            f"updates ({found['calls needed']:,.0f} calls)."
            + (f" Premise ignored, reproduced (would-be verdicts, not claims): {ignored}." if ignored else ""))
