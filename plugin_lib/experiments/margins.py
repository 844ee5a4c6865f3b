"""How the preregistered null claims' verdicts depend on their frozen margins.

Each equivalence or non-superiority claim of ``report.preregistered`` ("more layers do not help",
"the Plugin is as good as LoRA") is judged again by its own frozen test on the same stored runs
and the same bootstrap draws, at 1x, 0.5x and 0.25x the frozen margins (``MARGINS``). At 1x it
must give the committed verdict, which is checked. The frozen verdict stays the verdict: the
other two show how much it rests on the margins, which were fixed after the exploratory results
existed. ``python -m plugin_lib.experiments.margins`` writes
``results/confirm/margin_sensitivity.json``, which REPORT.md shows.
"""
from __future__ import annotations

from ..harness import profile as config
from ..harness.profile import Profile
from ..report import freeze
from ..report import preregistered as pre
from ..utils.io import atomic_write_json, read_json
from . import confirmation

FACTORS = (1.0, 0.5, 0.25)
FILE = "margin_sensitivity.json"


def sensitivity(profile: Profile | str = freeze.FROZEN_PROFILE) -> list[dict]:
    """Per null claim: its test, the frozen margins and its verdict at each factor of them."""
    prof = config.load_profile(profile)
    roles = confirmation.Roles(prof)
    rows = []
    for c in pre.CLAIMS:
        if c.test not in ("non-superiority", "equivalence"):
            continue
        test = pre.non_superiority if c.test == "non-superiority" else pre.equivalence
        found = confirmation.premise(roles, c)
        pairs = confirmation.comparisons(roles, c)
        compared = [pre.compare(a, b, confirmation.references(c.dataset, a[0]["test_ids"])) for a, b in pairs]
        verdicts = {}
        for factor in FACTORS:
            margins = {metric: value * factor for metric, value in pre.MARGINS.items()}
            verdicts[f"{factor:g}x"] = (pre.NOT_MEASURABLE if found is not None and not found["holds"] else
                                        pre.weakest([test(x, margins)["verdict"] for x in compared]))
        committed = read_json(config.results_dir(prof) / "claims" / f"{c.key}.json")["verdict"]
        if verdicts["1x"] != committed:
            raise RuntimeError(f"{c.key}: at the frozen margins the test gives {verdicts['1x']!r}, but the committed "
                               f"verdict is {committed!r}: the runs or the data are not the judged ones.")
        rows.append({"key": c.key, "claim": c.claim, "test": c.test, "margins": dict(pre.MARGINS),
                     "verdicts": verdicts})
    return rows


def main() -> None:
    prof = config.load_profile(freeze.FROZEN_PROFILE)
    path = config.results_dir(prof) / FILE
    atomic_write_json(path, {"factors": list(FACTORS), "claims": sensitivity(prof)})
    print(path)


if __name__ == "__main__":
    main()
