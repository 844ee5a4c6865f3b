"""Claims and verdicts: what the notebooks conclude about the paper's claims.

Notebooks state the paper's claims they test with :func:`record_claim`: the claim, the paper's
number, ours, and a verdict computed from the run (never typed in). They are stored as
``results/<profile>/claims/<key>.json`` and gathered into REPORT.md by ``report.document``.
"""
from __future__ import annotations

from ..harness.profile import Profile, results_dir
from ..utils.io import atomic_write_json, read_json

VERDICTS = ("reproduced", "not reproduced", "not measurable at this scale")
# The profiles whose numbers can support or refute a claim. Every other profile (smoke, and
# paper-twin, whose bases have random weights) only checks that code paths run.
MEASURING_PROFILES = ("paper", "local")


def record_claim(profile: Profile | str, key: str, claim: str, paper: str, ours: str, verdict: str) -> dict:
    """Store one claim's verdict (``results/<profile>/claims/<key>.json``) and return it.

    Only the paper and local profiles measure claims. The others (smoke: a handful of rows,
    one epoch; paper-twin: random-weight twins of the paper's bases) only check that code
    paths run, so their verdicts are always "not measurable at this scale", whatever the
    numbers say.
    """
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    name = profile.name if isinstance(profile, Profile) else profile
    if name not in MEASURING_PROFILES:
        verdict = "not measurable at this scale"
    entry = {"key": key, "claim": claim, "paper": paper, "ours": ours, "verdict": verdict}
    atomic_write_json(results_dir(profile) / "claims" / f"{key}.json", entry)
    return entry


def majority_verdict(count: int, total: int) -> str:
    """'reproduced' when a property holds on more than half of the cases."""
    return "reproduced" if count * 2 > total else "not reproduced"


def load_claims(profile: Profile | str) -> list[dict]:
    folder = results_dir(profile) / "claims"
    return [read_json(p) for p in sorted(folder.glob("*.json"))]
