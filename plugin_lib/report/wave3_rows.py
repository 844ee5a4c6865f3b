"""Wave 3's rows (``report.preregistered_wave3``): one per group of its claims, from the ``wave3``
profile's judged claims (``plugin-repro confirmation wave3 judge``), for the README and REPORT.md.

A group of one claim shows that claim's statistic and verdict; a group of several (a claim per
dataset) shows the count of its judged verdicts and, once all are judged, the weakest measurable
one (wave 2's ``row_verdict``). A claim of ``SEEN_BEFORE_FREEZE`` is labelled exploratory.
"""
from __future__ import annotations

from pathlib import Path

from ..harness import machine
from ..utils.io import read_json
from . import freeze, mixed
from . import preregistered_wave3 as wave3


def root() -> Path:
    """The wave3 profile's results folder (not created: a checkout without its runs has none)."""
    return machine.results_path(wave3.PROFILE)


def judged(folder: Path | None = None, group: str | None = None) -> dict[str, dict]:
    """The stored records of wave 3's judged claims (of one ``group``, or all)."""
    folder = root() if folder is None else folder
    keys = [c.key for c in wave3.CLAIMS if group is None or wave3.group(c) == group]
    return {k: read_json(path) for k in keys if (path := folder / "claims" / f"{k}.json").exists()}


def _counts(verdicts: list[str]) -> str:
    return ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))


def row(group: str, folder: Path | None = None) -> tuple[str, str]:
    """(verdict, statistic) of a group; ("", what is left) before any of its claims is judged.
    The verdict is "" until every claim of the group is judged."""
    keys = [c.key for c in wave3.CLAIMS if wave3.group(c) == group]
    found = judged(folder, group)
    if not found:
        return "", f"rules frozen at {freeze.WAVE3_FROZEN_AT[:7]}; runs under way"
    verdicts = [c["verdict"] for c in found.values()]
    if len(keys) == 1:
        return verdicts[0], next(iter(found.values()))["statistic"]["summary"]
    flagged = mixed.group_flag(found, {c.key: c.dataset for c in wave3.CLAIMS})
    same = [c.dataset for c in wave3.CLAIMS if c.key in found and group == "dexperts"
            and _same_outputs(folder or root(), c.dataset, "DExperts", "ProxyTuning")]
    expert = expert_ahead(folder or root()) if group == "proxy_tuning" else ""
    statistic = (f"{len(found)}/{len(keys)} datasets judged: {_counts(verdicts)}" + (f"; {flagged}" if flagged else "")
                 + (f"; {len(keys) - len(found)} waiting" if len(found) < len(keys) else "")
                 + (f"; same outputs as proxy-tuning on {', '.join(same)}" if same else "")
                 + (f"; {expert}" if expert else ""))
    return (wave3.row_verdict(verdicts) if len(found) == len(keys) else ""), statistic


def _mean_bleu(folder: Path, dataset: str, arm: str) -> float | None:
    runs = sorted((folder / "runs" / dataset).glob(f"*/{arm}-seed*.json"))
    return sum(read_json(run)["metrics"]["BLEU"] for run in runs) / len(runs) if runs else None


def expert_ahead(folder: Path, arms=("Plugin", "ProxyTuning", "DExperts")) -> str:
    """Where the expert alone (NewModel) has a higher mean BLEU than every arm that uses it, the
    Plugin included (descriptive: means over the stored seeds; no rule judges it)."""
    found = []
    for dataset in wave3.DATASETS:
        expert, others = _mean_bleu(folder, dataset, "NewModel"), {a: _mean_bleu(folder, dataset, a) for a in arms}
        if expert is not None and all(v is not None and expert > v for v in others.values()):
            found.append(f"{dataset}: the expert alone has the top mean BLEU ({expert:.4f}; Plugin "
                         f"{others['Plugin']:.4f}, proxy-tuning {others['ProxyTuning']:.4f})")
    return "; ".join(found)


def _same_outputs(folder: Path, dataset: str, arm: str, other: str) -> bool:
    """Whether ``arm`` decoded exactly ``other``'s outputs in every stored seed on ``dataset``
    (DExperts at proxy-tuning's alpha, when the base's nucleus never cuts the chosen token): its
    verdict then repeats the other's, and is not separate evidence."""
    runs = sorted((folder / "runs" / dataset).glob(f"*/{arm}-seed*.json"))
    pairs = [(run, run.with_name(run.name.replace(arm, other, 1))) for run in runs]
    return bool(pairs) and all(twin.exists() and read_json(run)["predictions"] == read_json(twin)["predictions"]
                               for run, twin in pairs)


def seen_before_freeze(group: str) -> bool:
    return any(c.key in wave3.SEEN_BEFORE_FREEZE for c in wave3.CLAIMS if wave3.group(c) == group)


def count_line(folder: Path | None = None) -> str:
    """The wave's tally; a claim of ``SEEN_BEFORE_FREEZE`` is counted apart, as exploratory."""
    found = judged(folder)
    verdicts = [c["verdict"] for k, c in found.items() if k not in wave3.SEEN_BEFORE_FREEZE]
    seen = [c["verdict"] for k, c in found.items() if k in wave3.SEEN_BEFORE_FREEZE]
    return (f"Wave 3: {len(wave3.CLAIMS)} claims, frozen at {freeze.WAVE3_FROZEN_AT[:7]} before its runs: "
            f"{len(verdicts)} judged" + (f" ({_counts(verdicts)})" if verdicts else "")
            + (f", and {len(seen)} exploratory (numbers seen before the freeze): {_counts(seen)}" if seen else "") + ".")
