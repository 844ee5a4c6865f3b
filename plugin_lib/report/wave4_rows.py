"""Wave 4's rows (``report.preregistered_wave4``): one per group of its claims, from the ``wave4``
profile's judged claims (``plugin-repro confirmation wave4 judge``), for the README and REPORT.md.

As wave 3's rows (``report.wave3_rows``): a group shows the count of its judged verdicts and,
once all are judged, the weakest measurable one (wave 2's ``row_verdict``); before any claim of it
is judged, that its runs are under way, and only then.
"""
from __future__ import annotations

from pathlib import Path

from ..harness import machine
from ..utils.io import read_json
from . import freeze, mixed
from . import preregistered_wave4 as wave4
from .wave3_rows import _counts


def root() -> Path:
    """The wave4 profile's results folder (not created: a checkout without its runs has none)."""
    return machine.results_path(wave4.PROFILE)


def judged(folder: Path | None = None, group: str | None = None) -> dict[str, dict]:
    """The stored records of wave 4's judged claims (of one ``group``, or all)."""
    folder = root() if folder is None else folder
    keys = [c.key for c in wave4.CLAIMS if group is None or wave4.group(c) == group]
    return {k: read_json(path) for k in keys if (path := folder / "claims" / f"{k}.json").exists()}


def under_way() -> str:
    return f"rules frozen at {freeze.WAVE4_FROZEN_AT[:7]}; runs under way"


def row(group: str, folder: Path | None = None) -> tuple[str, str]:
    """(verdict, statistic) of a group; ("", that its runs are under way) before any of its claims
    is judged. The verdict is "" until every claim of the group is judged."""
    keys = [c.key for c in wave4.CLAIMS if wave4.group(c) == group]
    found = judged(folder, group)
    if not found:
        return "", under_way()
    verdicts = [c["verdict"] for c in found.values()]
    flagged = mixed.group_flag(found, {c.key: c.dataset for c in wave4.CLAIMS})
    left_out = rivals_left_out(found)
    statistic = (f"{len(found)}/{len(keys)} datasets judged: {_counts(verdicts)}" + (f"; {flagged}" if flagged else "")
                 + (f"; {len(keys) - len(found)} waiting" if len(found) < len(keys) else "")
                 + (f"; {left_out}" if left_out else ""))
    return (wave4.row_verdict(verdicts) if len(found) == len(keys) else ""), statistic


# The rivals as the rows name them ("beats proxy-tuning and DExperts as published").
RIVAL_NAMES = {"ProxyTuning-pretrained": "proxy-tuning", "DExperts-pretrained": "DExperts"}


def rivals_left_out(found: dict[str, dict]) -> str:
    """Where a group's judged claims compared fewer rivals than both, by rival and dataset: a row
    that says "beats proxy-tuning and DExperts" must say where one was left out, and why."""
    dataset = {c.key: c.dataset for c in wave4.CLAIMS}
    why_short = {"premise failed": "its expert did not help", "the same outputs": "the same outputs"}
    by_reason: dict[tuple[str, str], list[str]] = {}
    for key, record in found.items():
        rivals = record["statistic"].get("result", {}).get("rivals", {})
        for rival, why in rivals.get("left out", {}).items():
            reason = next((short for start, short in why_short.items() if why.startswith(start)), why)
            by_reason.setdefault((rival, reason), []).append(dataset[key])
    return "; ".join(f"{RIVAL_NAMES[rival]} = {RIVAL_NAMES[wave4.SAME_OUTPUTS_AS[rival]]} on {', '.join(names)} "
                     "(the same outputs)" if reason == "the same outputs"
                     else f"{RIVAL_NAMES[rival]} left out on {', '.join(names)} ({reason})"
                     for rival in wave4.PROXY_RIVALS for (r, reason), names in by_reason.items() if r == rival)


def count_line(folder: Path | None = None) -> str:
    """The wave's tally."""
    verdicts = [c["verdict"] for c in judged(folder).values()]
    return (f"Wave 4: {len(wave4.CLAIMS)} claims, frozen at {freeze.WAVE4_FROZEN_AT[:7]} before its runs: "
            f"{len(verdicts)} judged" + (f" ({_counts(verdicts)})" if verdicts else "; runs under way") + ".")
