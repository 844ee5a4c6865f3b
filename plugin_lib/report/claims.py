"""Claims and verdicts: what the notebooks conclude about the paper's claims.

Notebooks state the claims they test with :func:`record_claim`: the claim, the paper's number,
ours, the ``rule`` (the test in words, a constant of the experiment module; for the local
profile written after its numbers, so exploratory: ``report.preregistered`` holds the rules
frozen before the confirmatory ones), the ``statistic`` (effect sizes, p-values or intervals, and n) and the verdict
that rule gives (never typed in). They are stored as ``results/<profile>/claims/<key>.json`` and
gathered into REPORT.md and the README by ``commands.document``.

``scope`` keeps the paper's claims ("paper") apart from checks that go beyond the paper
("beyond": top-k log-probability APIs, Theorem 1 measured); they are tallied separately.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

import numpy as np

from ..harness.machine import results_dir
from ..harness.profile import Profile, load_profile, profile_names
from ..utils.io import atomic_write_json, read_json
from . import mixed
from .verdicts import NOT_MEASURABLE, VERDICTS  # noqa: F401  (VERDICTS: the vocabulary, re-exported)

SCOPES = ("paper", "beyond")
# The profiles whose numbers can support or refute a claim. Every other profile (smoke, and
# paper-twin, whose bases have random weights) only checks that code paths run.
MEASURING_PROFILES = ("local", "paper", "confirm", "wave3", "wave4")
RULE_NOT_RECORDED = "rule not recorded: rerun the notebook"
STATISTIC_NOT_RECORDED = "not recorded: rerun the notebook"


def n_seeds(count: int | None) -> str:
    """"1 seed", "3 seeds": how statistics' summaries state their number of seeds."""
    return f"{count} seed{'' if count == 1 else 's'}"


def plain(value):
    """``value`` with numpy scalars, tuples and fractions turned into JSON types (NaN: None)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating, Fraction)):
        value = float(value)
        return None if math.isnan(value) else value
    return value


def record_claim(profile: Profile | str, key: str, claim: str, paper: str, ours: str, verdict: str, *,
                 rule: str, statistic: Mapping, scope: str = "paper", preregistered: bool = False) -> dict:
    """Store one claim's verdict (``results/<profile>/claims/<key>.json``) and return it.

    ``statistic`` needs a ``summary`` (one short line, shown in the README) and ``n`` (test
    inputs and seeds). In a preregistered profile (one with fresh ``test_inputs``: ``confirm``)
    ``claims/`` holds only the frozen rules' verdicts (``preregistered``, from
    ``experiments.confirmation``); a notebook's own rule goes to ``notebook-claims/``.
    Profiles outside ``MEASURING_PROFILES`` (smoke: a handful of rows, one
    epoch; paper-twin: random-weight twins of the paper's bases) only check that code paths
    run, so their verdicts are always "not measurable at this scale", whatever the numbers
    say; the rule's own verdict is kept as ``rule_verdict``.
    """
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    if not isinstance(rule, str) or not rule.strip():
        raise ValueError("rule must state the test in words.")
    missing = {"summary", "n"} - set(statistic)
    if missing:
        raise ValueError(f"statistic lacks {sorted(missing)}: give a one-line summary and n (inputs, seeds).")
    name = profile.name if isinstance(profile, Profile) else profile
    entry = {"key": key, "claim": claim, "paper": paper, "ours": ours, "verdict": verdict, "rule": rule,
             "statistic": plain(statistic), "scope": scope}
    if name not in MEASURING_PROFILES:
        entry.update(verdict=NOT_MEASURABLE, rule_verdict=verdict)
    prof = profile if isinstance(profile, Profile) else (load_profile(name) if name in profile_names() else None)
    folder = "claims" if preregistered or prof is None or prof.test_inputs is None else "notebook-claims"
    if preregistered:
        entry["preregistered"] = True
    deficit = mixed.flag(entry)
    if deficit:  # a significant deficit beside a favourable verdict (the verdict stands)
        entry["mixed"] = deficit
    atomic_write_json(results_dir(profile) / folder / f"{key}.json", entry)
    return entry


def load_claims(profile: Profile | str) -> list[dict]:
    folder = results_dir(profile) / "claims"
    return [read_json(p) for p in sorted(folder.glob("*.json"))]
