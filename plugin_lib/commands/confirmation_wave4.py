"""The fourth preregistered wave (issue 73): the units its claims need, on the ``wave4`` profile.

Its runs are the ``wave4`` profile's own, on its frozen inputs:

- on the four datasets, notebook 15's arms from a pretrained small model (proxy-tuning and
  DExperts as published: NewModel-, ProxyTuning-, DExperts- and Plugin-pretrained), beside the
  1-layer Plugin and Zeroshot;
- on WebNLG, CommonGen and Adidas, notebook 06's bases (the original and the longest fine-tune,
  with Zeroshot and the Plugin on each) and notebook 07's Plugin-4L, the random initialisation
  of Plugin-pretrained's depth.

Its claims are judged under the rules frozen in ``report.preregistered_wave4``; like the other
waves' modules this one finds the runs that play each claim's roles (wave 1's ``Roles``, whose
fine-tuned bases and comparisons it reuses) and changes no rule.

    plugin-repro grid plan --profile wave4 --wave 4     # what is stored, what is left
    plugin-repro grid run --profile wave4 --wave 4      # compute it (resumes)
    plugin-repro confirmation wave4 status|judge        # python -m plugin_lib.commands.confirmation_wave4
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

import pandas as pd

from ..experiments import ablations, base_quality, proxy
from ..experiments import confirmation as wave1
from ..experiments.confirmation import Roles, claim_states, judge_each, record_wave_claim, references
from ..harness import grid
from ..harness.profile import Profile, load_profile
from ..report import freeze, mixed
from ..report import preregistered as pre
from ..report import preregistered_wave4 as wave4
from ..report.claim_summary import summary, versus_labels
from . import studies
from .confirmation import command_line

PROFILE = wave4.PROFILE
PROXY_DATASETS, FIGURE_DATASETS = wave4.PROXY_DATASETS, wave4.FIGURE_DATASETS  # E2E's Figures 2, 3: wave 1's


def units(profile: Profile) -> list[grid.Unit]:
    """The wave's units (done ones included: the plan marks them). Notebook 15's from-scratch
    arms (NewModel, ProxyTuning, DExperts) are wave 3's claims, not this wave's: left out."""
    proxy_notebook = studies.notebook_of(proxy.units)
    found = []
    for dataset in PROXY_DATASETS:
        found += grid.table_units(dataset, profile, proxy_notebook, method_names=["Zeroshot", "Plugin"])
        for model_name in profile.base_models:
            found += grid.task_units(grid.TaskRef(model_name, dataset), profile,
                                     proxy.pretrained_jobs(model_name, profile), proxy_notebook)
    for dataset in FIGURE_DATASETS:
        found += studies.study_units(studies.notebook_of(base_quality.units), profile, dataset=dataset)
        found += studies.study_units(studies.notebook_of(ablations.complexity_units), profile, dataset=dataset)
    return grid.merge(found)


# ---------------------------------------------------------------- judged under the frozen rules


def _compare(roles: Roles, dataset: str, a: str, b: str) -> dict:
    a_runs, b_runs = roles.runs(dataset, a), roles.runs(dataset, b)
    return pre.compare(a_runs, b_runs, references(dataset, a_runs[0]["test_ids"]))


def rivals(roles: Roles, dataset: str) -> dict:
    """The proxy rivals a claim on ``dataset`` compares with (the frozen ``proxy_rivals``), with
    each rival's premise."""
    premises = {r: wave4.expert_helps(roles.runs(dataset, r)) for r in wave4.PROXY_RIVALS}
    same = {r: wave4.same_outputs(roles.runs(dataset, r), roles.runs(dataset, partner))
            for r, partner in wave4.SAME_OUTPUTS_AS.items()}
    return {**wave4.proxy_rivals(premises, same), "premises": premises}


def judge_claim(roles: Roles, c: pre.Claim) -> dict:
    if c.test == "proxy":
        found = rivals(roles, c.dataset)
        compared = {r: _compare(roles, c.dataset, c.a, r) for r in found["compared"]}
        result = wave4.judge_proxy(found, compared)
        if compared:
            mixed.note_deficits("superiority", result["comparisons"], list(compared.values()))
        return result
    premise = wave1.premise(roles, c)
    if premise is not None and not premise["holds"]:
        return {"verdict": pre.NOT_MEASURABLE, "premise": premise}
    pairs = wave1.comparisons(roles, c)
    compared = [pre.compare(a, b, references(c.dataset, a[0]["test_ids"])) for a, b in pairs]
    result = wave4.judge_superiority(compared)
    mixed.note_deficits("superiority", result["comparisons"], compared)
    for row, label in zip(result["comparisons"], versus_labels(pairs)):
        row["versus"] = label
    return {**result, **({"premise": premise} if premise is not None else {})}


def gather(roles: Roles, c: pre.Claim) -> None:
    """Raise Missing while a run the claim reads is not stored."""
    if c.test == "proxy":
        for label in (c.a, *wave4.PROXY_RIVALS):
            roles.runs(c.dataset, label)
        return
    if c.premise and not wave1.premise(roles, c)["holds"]:
        return
    wave1.comparisons(roles, c)


def claim_summary(c: pre.Claim, result: dict) -> str:
    """One line per claim, as waves 1 to 3 word a superiority claim; a proxy claim names the rivals
    left out (all of them: not measurable)."""
    left = (result.get("rivals") or {}).get("left out") or {}
    dropped = "".join(f"; {rival} left out: {why}" for rival, why in left.items())
    if c.test == "proxy" and not result.get("comparisons"):
        return "no rival left" + dropped
    return summary(dataclasses.replace(c, test="superiority"), result) + dropped


def status(profile: Profile | None = None) -> pd.DataFrame:
    """Per wave-4 claim: ready to judge, or what is missing."""
    roles = Roles(profile or load_profile(wave4.PROFILE))
    return claim_states(wave4.CLAIMS, lambda c: gather(roles, c))


def judge(profile: Profile | None = None, keys: Sequence[str] | None = None) -> list[dict]:
    """Record the verdict of every wave-4 claim whose runs are stored (or of ``keys``)."""
    profile = profile or load_profile(wave4.PROFILE)
    roles = Roles(profile)

    def judge_one(c) -> dict:
        gather(roles, c)
        return judge_claim(roles, c)

    def record(c, result: dict) -> dict:
        return record_wave_claim(profile, wave4, c, result, claim_summary(c, result), frozen_at=freeze.WAVE4_FROZEN_AT,
                                 n={"inputs": wave4.INPUTS[c.dataset], "seeds": len(profile.seeds)},
                                 test_inputs=f"{wave4.INPUTS[c.dataset]} fresh (frozen with the rules)",
                                 confirmatory=c.key not in wave4.SEEN_BEFORE_FREEZE)

    return judge_each(wave4.CLAIMS, keys, judge_one, record)


def main(argv: Sequence[str] | None = None) -> None:
    command_line("wave4", argv)


if __name__ == "__main__":
    sys.exit(main())
