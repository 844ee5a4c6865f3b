"""The second preregistered wave, run and judged: the units its claims need, and the stored runs
of the ``confirm`` profile under the rules frozen in ``report.preregistered_wave2``.

It lives with the commands, above the layers, because it collects units from three notebooks'
modules. Like ``experiments.confirmation`` (wave 1), it finds the runs that play each claim's
roles and changes no rule. Its runs are the ``confirm`` profile's own, at its unchanged
settings, on the datasets the frozen rules name: the units of notebooks 05 (BDPL at the
profile's budget; not the learning-budget search), 11 (LoRA) and 07 (the 2-, 4- and 8-layer
models), on WebNLG, CommonGen and Adidas. The Plugin, Zeroshot and their caches come from the
main tables' stored runs.

    plugin-repro grid plan --profile confirm --wave 2     # what is stored, what is left
    plugin-repro grid run --profile confirm --wave 2      # compute it (resumes)
    plugin-repro confirmation wave2 status|judge|margins  # python -m plugin_lib.commands.confirmation_wave2
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

import pandas as pd

from ..harness.baselines import bdpl
from ..harness import grid
from ..harness.machine import results_dir
from ..harness.profile import Profile, ablation_seeds, ablation_settings, load_profile
from ..report import bdpl_reach, freeze, mixed
from ..report import preregistered as pre
from ..report import preregistered_wave2 as wave2
from ..report.claims import record_claim
from ..utils.io import atomic_write_json, read_json
from ..experiments import ablations, table5, table8
from ..experiments.confirmation import PROFILE, Missing, Roles, claim_states, judge_each, margin_verdicts, references
from ..report.claim_summary import summary, versus_labels
from . import studies
from .confirmation import command_line
from ..harness.baselines.variants import complexity_variants, variant_jobs

MARGINS_FILE = "margin_sensitivity_wave2.json"


def units(profile: Profile) -> list[grid.Unit]:
    """The wave's units (done ones included: the plan marks them)."""
    datasets = list(wave2.DATASETS)
    found = [u for u in studies.study_units(studies.notebook_of(table5.units), profile, datasets=datasets)
             if "learning-budget" not in u.key]
    found += studies.study_units(studies.notebook_of(table8.units), profile, datasets=datasets)
    setup = ablation_settings(profile)
    variants = complexity_variants(setup.model, (1, *wave2.LAYERS), None, pretrained=False)
    jobs = variant_jobs(variants, ablation_seeds(setup, "complexity", profile), setup.complexity_hparams)
    for dataset in datasets:
        found += grid.task_units(grid.TaskRef(setup.model, dataset), profile,
                                 [(j.method, j.seed, j.label, j.arch, j.narrow) for j in jobs],
                                 studies.notebook_of(ablations.complexity_units))
    return grid.merge(found)


class WaveRoles(Roles):
    """Wave 1's roles, with BDPL's prompts of the claim's own dataset."""

    def dataset_prompts(self, dataset: str) -> list[dict]:
        paths = [bdpl.prompt_path(self.profile, dataset, self.base, s) for s in self.profile.seeds]
        missing = [p.name for p in paths if not p.exists()]
        if missing:
            raise Missing(f"{dataset}: BDPL prompts {missing}")
        return [read_json(p) for p in paths]


def comparisons(roles: WaveRoles, c: pre.Claim) -> list[tuple[list[dict], list[dict]]]:
    """(A's runs, B's runs) per comparison of the claim."""
    d = c.dataset
    if c.a == "Plugin-deeper":
        return [(roles.runs(d, label), roles.runs(d, "Plugin")) for label in wave2.deeper_labels()]
    return [(roles.runs(d, c.a), roles.runs(d, b)) for b in c.b]


def premise(roles: WaveRoles, c: pre.Claim) -> dict | None:
    if c.premise is None:
        return None
    if c.premise == "bdpl learned":
        return pre.bdpl_learned(roles.dataset_prompts(c.dataset))
    raise ValueError(f"Unknown wave-2 premise {c.premise!r}")


def judge_claim(roles: WaveRoles, c: pre.Claim) -> dict:
    found = premise(roles, c)
    if found is not None and not found["holds"]:
        return {"verdict": pre.NOT_MEASURABLE, "premise": found}
    pairs = comparisons(roles, c)
    compared = [pre.compare(a, b, references(c.dataset, a[0]["test_ids"])) for a, b in pairs]
    result = wave2.judge_comparisons(c, compared)
    mixed.note_deficits(c.test, result["comparisons"], compared)  # every test type: shown beside the verdict
    for row, label in zip(result["comparisons"], versus_labels(pairs)):
        row["versus"] = label
    if found is not None:
        result["premise"] = found
    return result


def status(profile: Profile | None = None) -> pd.DataFrame:
    """Per wave-2 claim: ready to judge, or what is missing."""
    roles = WaveRoles(profile or load_profile(PROFILE))
    return claim_states(wave2.CLAIMS, lambda c: gather(roles, c))


def gather(roles: WaveRoles, c: pre.Claim) -> None:
    """Raise Missing when anything the claim's test reads is not stored (a failed premise is
    enough: the claim is then not measurable)."""
    if not (c.premise and not premise(roles, c)["holds"]):
        comparisons(roles, c)


def judge(profile: Profile | None = None, keys: Sequence[str] | None = None) -> list[dict]:
    """Record the verdict of every wave-2 claim whose runs are stored (or of ``keys``)."""
    profile = profile or load_profile(PROFILE)
    roles = WaveRoles(profile)

    def record(c, result: dict) -> dict:
        n = (result.get("comparisons") or [{}])[0].get("n") or {"inputs": profile.rows.test, "seeds": None}
        return record_claim(
            profile, c.key, f"{c.claim} (notebook {c.notebook}; wave 2)", "", summary(c, result), result["verdict"],
            rule=wave2.rule_text(c), scope=c.scope, preregistered=True,
            statistic={"summary": summary(c, result), "n": n, "result": result, "wave": wave2.WAVE,
                       "frozen_at": freeze.WAVE2_FROZEN_AT, "group": wave2.group(c),
                       "test inputs": f"{profile.rows.test} fresh per dataset (wave 1's, frozen)"})

    return judge_each(wave2.CLAIMS, keys, lambda c: judge_claim(roles, c), record)


WOULD_BE_FILE = bdpl_reach.WOULD_BE_FILE


def premise_ignored(profile: Profile | None = None) -> list[dict]:
    """Table 5's wave-2 claims judged as if BDPL's premise held: would-be verdicts, never claims
    (the premise failed, so each claim is not measurable). Kept in ``WOULD_BE_FILE`` for the
    README's line beside those rows (``report.bdpl_reach``)."""
    profile = profile or load_profile(PROFILE)
    roles, rows = WaveRoles(profile), []
    for c in (c for c in wave2.CLAIMS if wave2.group(c) == "table5"):
        pairs = comparisons(roles, c)
        result = wave2.judge_comparisons(c, [pre.compare(a, b, references(c.dataset, a[0]["test_ids"]))
                                             for a, b in pairs])
        rows.append({"key": c.key, "dataset": c.dataset, "a": c.a, "b": list(c.b),
                     "would-be verdict": result["verdict"]})
    atomic_write_json(results_dir(profile) / WOULD_BE_FILE,
                      {"note": "would-be verdicts with BDPL's failed premise ignored: exploratory, not claims",
                       "claims": rows})
    return rows


def margin_sensitivity(profile: Profile | None = None) -> list[dict]:
    """Each judged null claim of the wave at 1x, 0.5x and 0.25x its frozen margins (as wave 1's)."""
    profile = profile or load_profile(PROFILE)
    roles, rows = WaveRoles(profile), []
    for c in (c for c in wave2.CLAIMS if c.test in ("non-superiority", "equivalence")):
        stored = results_dir(profile) / "claims" / f"{c.key}.json"
        if stored.exists():
            compared = [pre.compare(a, b, references(c.dataset, a[0]["test_ids"])) for a, b in comparisons(roles, c)]
            rows.append(margin_verdicts(c, compared, premise(roles, c), read_json(stored)["verdict"]))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    command_line("wave2", argv)


if __name__ == "__main__":
    sys.exit(main())
