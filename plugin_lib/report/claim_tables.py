"""Claim records as Markdown: the verdict legends, a table per scope with its tally, every
claim's rule and statistic (its comparisons as tables), a verdict with the significant deficits it
does not say (``report.mixed``), and the null claims' margin sensitivity. ``commands.document``
puts them on REPORT.md's page.
"""
from __future__ import annotations

from pathlib import Path

from ..metrics import METRIC_NAMES
from ..utils.io import read_json
from . import mixed
from .claims import RULE_NOT_RECORDED, SCOPES, STATISTIC_NOT_RECORDED, VERDICTS
from .stats import BOOTSTRAP_METRICS

# Claim records written before scopes existed: the checks beyond the paper, by key.
_BEYOND_PAPER_KEYS = ("topk_", "theorem1")
SCOPE_TITLES = {"paper": "The paper's claims", "beyond": "Checks beyond the paper"}


VERDICT_LEGEND = (
    "Each verdict follows a rule stated in code (printed with its statistic under "
    "*Rules and statistics*): **reproduced**: the paper's direction, and a test passes (p < 0.05 in most seeds, "
    "or a confidence interval over seeds that excludes no effect); **direction only**: the paper's direction, "
    "not significant at this scale; **not reproduced**: not the paper's direction; **not measurable at this "
    "scale**: the experiment's premise does not hold here. \"Most\" means more than half."
)


PREREGISTERED_LEGEND = (
    "Each claim's rule is printed with its statistic under *Rules and statistics* (in brief in "
    "[docs/preregistration.md](../../docs/preregistration.md)). Paired comparisons use a two-level bootstrap "
    "(seeds, then inputs) and Holm's adjustment over BLEU, ROUGE-1, ROUGE-2 and NIST. **reproduced**: the paper's "
    "direction on most of the seven metrics and significant on most of the four, or, for a null claim, "
    "equivalence (or non-superiority) within margins fixed in advance; **direction only**: the paper's direction, "
    "not shown at this scale; **not reproduced**: neither; **not measurable at this scale**: a premise the claim "
    "rests on failed."
)


# Frozen records tagged `scope: paper` that check beyond the paper (the paper has no proxy-tuning
# arm): shown as such, per the erratum in docs/preregistration.md; the records stay as stored.
_RETAGGED_BEYOND = ("wave3_proxy_tuning_", "wave3_dexperts_")


def scope_of(claim: dict) -> str:
    if claim["key"].startswith(_RETAGGED_BEYOND):
        return "beyond"
    return claim.get("scope") or ("beyond" if claim["key"].startswith(_BEYOND_PAPER_KEYS) else "paper")


def statistic_summary(claim: dict) -> str:
    statistic = claim.get("statistic")
    return statistic.get("summary", STATISTIC_NOT_RECORDED) if isinstance(statistic, dict) else STATISTIC_NOT_RECORDED


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if value is None:
        return "n/a"
    return str(value)


def _records(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def statistic_details(statistic: dict, prefix: str = "") -> list[str]:
    """Lines of a statistic: nested keys joined by " / ", a dict of plain values on one line
    ("key value, key value"), ``n`` first, floats to 4 significant digits. Lists of records
    (a claim's comparisons, BDPL's seeds) are left to :func:`statistic_tables`."""
    lines = []
    for key in sorted(statistic, key=lambda k: k != "n"):
        value, name = statistic[key], f"{prefix}{key}"
        if key == "summary" or _records(value):
            continue
        if isinstance(value, dict) and any(isinstance(v, dict) or _records(v) for v in value.values()):
            lines += statistic_details(value, f"{name} / ")
        elif isinstance(value, dict):
            lines.append(f"{name}: " + ", ".join(f"{k} {_value(v)}" for k, v in value.items()))
        else:
            lines.append(f"{name}: {_value(value)}")
    return lines


def _cell(value) -> str:
    """A value as a Markdown table cell: "|" escaped, on one line."""
    return _value(value).replace("|", "\\|").replace("\n", " ")


# What a comparison's Holm-adjusted p tests, by the metric list its test fills in
# (``report.preregistered``: superiority, non-superiority, equivalence).
_P_MEANINGS = {"not better by the margin on": "Holm p, not better by the margin",
               "equivalent on": "Holm p, TOST", "significant on": "Holm p"}


def _comparison_row(comparison: dict, listed: list[str], metrics: list[str]) -> list[str]:
    """A comparison's cells: its label and verdict; per metric list "k/N" and the metrics left
    out; per bootstrap metric the difference A - B, its interval and Holm p; the effect (A's mean
    minus B's) on the other metrics."""
    interval = "ci95" if "ci95" in comparison else "ci90"
    cells = [_cell(comparison["versus"]), comparison["verdict"]]
    for key in listed:
        pool = METRIC_NAMES if key == "ahead on" else metrics
        missing = [m for m in pool if m not in comparison[key]]
        cells.append(f"{len(comparison[key])}/{len(pool)}" + (f" (not {', '.join(missing)})" if missing else ""))
    for metric in metrics:
        low, high = comparison[interval][metric]
        cells.append(f"{comparison['difference'][metric]:+.4f} [{low:+.4f}, {high:+.4f}], "
                     f"p {comparison['p (Holm)'][metric]:.3f}")
    others = [m for m in comparison.get("effect", {}) if m not in metrics]
    cells.append(", ".join(f"{m} {comparison['effect'][m]:+.4f}" for m in others) or "-")
    return cells


def records_table(records: list[dict]) -> list[str]:
    """A list of records as one Markdown table. Paired comparisons (records with ``versus``, as
    ``report.preregistered`` makes them): per B its verdict, its metric lists, and per bootstrap
    metric the difference, its interval and Holm-adjusted p (``_P_MEANINGS`` says of what).
    Other records: their plain values, one column per key any of them has."""
    if all("versus" in r and "difference" in r for r in records):
        first = records[0]
        metrics = [m for m in BOOTSTRAP_METRICS if m in first["difference"]]
        metrics += [m for m in first["difference"] if m not in metrics]
        listed = [k for k, v in first.items() if isinstance(v, list) and all(isinstance(x, str) for x in v)]
        meaning = next((_P_MEANINGS[k] for k in _P_MEANINGS if k in first), "Holm p")
        levels = {"95%" if "ci95" in r else "90%" for r in records}
        header = ["comparison", "verdict", *listed,
                  *(f"{m}: A - B [{'/'.join(sorted(levels))} CI], {meaning}" for m in metrics), "other metrics: A - B"]
        rows = [_comparison_row(r, listed, metrics) for r in records]
    else:
        header = list(dict.fromkeys(k for r in records for k, v in r.items() if not isinstance(v, (dict, list))))
        rows = [[_cell(r.get(k)) for k in header] for r in records]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
            *("| " + " | ".join(row) + " |" for row in rows)]


def statistic_tables(statistic: dict, prefix: str = "") -> list[tuple[str, list[dict]]]:
    """The lists of records inside a statistic, by their " / "-joined key."""
    found = []
    for key, value in statistic.items():
        if _records(value):
            found.append((f"{prefix}{key}", value))
        elif isinstance(value, dict):
            found += statistic_tables(value, f"{prefix}{key} / ")
    return found


# A claim record without a rule predates the stated rules: its verdict was not given by a test
# fixed in code, so it is shown as awaiting its notebook's rerun (the tally line says why) and
# left out of the tallies.
NOT_RECHECKED = "not re-checked yet"


def checked(claim: dict) -> bool:
    return bool(claim.get("rule"))


def shown_verdict(claim: dict) -> str:
    """The verdict in bold, with a significant deficit it does not say beside it (``mixed.flag``)."""
    if not checked(claim):
        return f"*{NOT_RECHECKED}*"
    flagged = mixed.flag(claim)
    return f"**{claim['verdict']}**" + (f" ({flagged})" if flagged else "")


def tally(claims: list[dict]) -> str:
    counts = {v: sum(c["verdict"] == v for c in claims if checked(c)) for v in VERDICTS}
    text = ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "none"  # a verdict none got is left out
    stale = sum(not checked(c) for c in claims)
    return text + (f"; {stale} not re-checked yet (recorded before the rules; their notebooks must run again)"
                   if stale else "")


def claims_table(claims: list[dict], legend: str = VERDICT_LEGEND) -> list[str]:
    """REPORT.md's verdicts: per scope a table (claim, paper, ours, statistic, verdict; no
    statistic column where each is the same as ours) and its tally, then every claim's rule and
    full statistic, its comparisons as tables."""
    if not claims:
        return ["No claim has been checked in this profile yet.", ""]
    lines = [legend, ""]
    for scope in SCOPES:
        chosen = [c for c in claims if scope_of(c) == scope]
        lines += [f"### {SCOPE_TITLES[scope]}", ""]
        if not chosen:
            lines += ["None checked in this profile yet.", ""]
            continue
        if all(c["ours"] == statistic_summary(c) for c in chosen):
            lines += ["| claim | paper | ours (the statistic) | verdict |", "| --- | --- | --- | --- |"]
            lines += [f"| {c['claim']} | {c['paper']} | {c['ours']} | {shown_verdict(c)} |" for c in chosen]
        else:
            lines += ["| claim | paper | ours | statistic | verdict |", "| --- | --- | --- | --- | --- |"]
            lines += [f"| {c['claim']} | {c['paper']} | {c['ours']} | {statistic_summary(c)} | {shown_verdict(c)} |"
                      for c in chosen]
        lines += ["", f"{SCOPE_TITLES[scope]}, in all ({len(chosen)}): {tally(chosen)}.", ""]
    lines += ["### Rules and statistics", ""]
    for c in claims:
        statistic = c.get("statistic")
        lines += [f"**{c['claim']}** (`{c['key']}`, {scope_of(c)})", "",
                  f"- rule: {c.get('rule') or RULE_NOT_RECORDED}",
                  f"- statistic: {statistic_summary(c)}"]
        if isinstance(statistic, dict):
            lines += [f"  - {line}" for line in statistic_details(statistic)]
        note = (f" (the rule alone gives *{c['rule_verdict']}*; this profile only checks that the code runs)"
                if c.get("rule_verdict") and c["rule_verdict"] != c["verdict"] else "")
        lines += [f"- verdict: {shown_verdict(c)}{note}", ""]
        for name, records in statistic_tables(statistic) if isinstance(statistic, dict) else ():
            lines += [f"*{name}* (in full: [claims/{c['key']}.json](claims/{c['key']}.json))", "",
                      *records_table(records), ""]
    return lines


def margin_section(root: Path, file: str = "margin_sensitivity.json",
                   command: str = "plugin-repro confirmation margins") -> list[str]:
    """The null claims' verdicts at 1x, 0.5x and 0.25x their frozen margins (``command`` writes
    ``file``: wave 1's, or wave 2's ``margin_sensitivity_wave2.json``); nothing where it is absent."""
    path = root / file
    if not path.is_file():
        return []
    found = read_json(path)
    factors = [f"{f:g}x" for f in found["factors"]]
    lines = ["### Margin sensitivity of the null claims", "",
             "Each equivalence or non-superiority claim judged again by its own frozen test, on the same runs and "
             f"bootstrap draws, at fractions of its frozen margins (`{command}`). The "
             "verdict is the one at 1x; the others show how much it rests on margins that were fixed after the "
             "exploratory results existed.", "",
             "| claim | test | frozen margins | " + " | ".join(factors) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in factors) + " |"]
    for c in found["claims"]:
        margins = ", ".join(f"{m} {v:g}" for m, v in c["margins"].items())
        lines.append(f"| {c['claim']} (`{c['key']}`) | {c['test']} | {margins} | "
                     + " | ".join(c["verdicts"][f] for f in factors) + " |")
    return lines + [""]
