"""The third preregistered wave, run and judged: the units its claims need, and the stored runs
of the ``wave3`` profile under the rules frozen in ``report.preregistered_wave3``.

Like wave 2's module it lives with the commands (it collects units from notebooks 01-04 and 15)
and finds the runs that play each claim's roles; it changes no rule. The runs are the
``wave3`` profile's own, on its frozen inputs: Zeroshot, NewModel, the Plugin, WeightedComb,
proxy-tuning and DExperts on the four datasets.

    plugin-repro grid plan --profile wave3 --wave 3     # what is stored, what is left
    plugin-repro grid run --profile wave3 --wave 3      # compute it (resumes)
    plugin-repro confirmation wave3 status|judge        # python -m plugin_lib.commands.confirmation_wave3
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

import pandas as pd

from ..experiments import proxy
from ..experiments.confirmation import Roles, claim_states, judge_each, record_wave_claim, references
from ..harness import flops, grid
from ..harness.profile import Profile, load_profile
from ..report.claim_summary import summary
from ..report import freeze, mixed
from ..report import preregistered as pre
from ..report import preregistered_wave3 as wave3
from . import studies
from .confirmation import command_line


def units(profile: Profile) -> list[grid.Unit]:
    """The wave's units (done ones included: the plan marks them): notebook 15's arms, and
    WeightedComb of the main tables."""
    found = studies.study_units(studies.notebook_of(proxy.units), profile, datasets=list(wave3.DATASETS))
    for dataset in wave3.DATASETS:
        found += studies.study_units(studies.main_table_notebook(dataset), profile, methods=["WeightedComb"])
    return grid.merge(found)


def _compare(roles: Roles, dataset: str, b: str) -> dict:
    a_runs, b_runs = roles.runs(dataset, "Plugin"), roles.runs(dataset, b)
    return pre.compare(a_runs, b_runs, references(dataset, a_runs[0]["test_ids"]))


def premise(roles: Roles, c: pre.Claim, dataset: str | None = None) -> dict | None:
    """The claim's premise on its (or ``dataset``'s) stored records; None when it has none."""
    dataset = dataset or c.dataset
    if c.premise in ("proxy-tuning learned", "dexperts learned"):
        return wave3.improves_on_base([wave3.alpha_search_losses(r) for r in roles.runs(dataset, c.b[0])])
    if c.premise == "weightedcomb learned":
        base_alone = {r["seed"]: wave3.alpha_search_losses(r)[1] for r in roles.runs(dataset, "ProxyTuning")}
        return wave3.improves_on_base([(r["training"]["val_loss"], base_alone[r["seed"]])
                                       for r in roles.runs(dataset, "WeightedComb")])
    if c.premise is None:
        return None
    raise ValueError(f"Unknown wave-3 premise {c.premise!r}")


def flops_counts() -> dict[tuple[str, int], tuple[int, int]]:
    """The FLOPs claim's exact counts (minutes on a CPU: models on the meta device)."""
    counts = {}
    for shape in wave3.FLOPS_SHAPES:
        for length in wave3.FLOPS_PROMPT_LENGTHS:
            found = flops.shape_comparison(shape, prompt_length=length, new_tokens=wave3.FLOPS_NEW_TOKENS,
                                           lora_rank=wave3.FLOPS_LORA_RANK)
            counts[shape, length] = (found["plugin_flops"], found["lora_flops"])
    return counts


def judge_claim(roles: Roles, c: pre.Claim) -> dict:
    if c.test == "flops gap":
        return wave3.judge_flops(flops_counts())
    if c.test == "nist":
        return wave3.judge_newmodel_nist({d: _compare(roles, d, "NewModel") for d in wave3.DATASETS})
    if c.test == "weightedcomb":
        learned = {d: premise(roles, c, d) for d in wave3.DATASETS}
        return wave3.judge_weightedcomb({d: _compare(roles, d, "WeightedComb") for d in wave3.DATASETS}, learned)
    found = premise(roles, c)
    if not found["holds"]:
        return {"verdict": pre.NOT_MEASURABLE, "premise": found}
    compared = [_compare(roles, c.dataset, b) for b in c.b]
    result = wave3.judge_superiority(compared)
    mixed.note_deficits(c.test, result["comparisons"], compared)
    for row, b in zip(result["comparisons"], c.b):
        row["versus"] = f"vs {b}"
    return {**result, "premise": found}


def claim_summary(c: pre.Claim, result: dict) -> str:
    """One line per claim: the superiority claims as waves 1 and 2 word them, the others their own."""
    if c.test == "superiority":
        return summary(c, result)
    if c.test == "flops gap":
        lengths = result["per prompt length"]
        return (f"Plugin/LoRA at {' / '.join(map(str, lengths))}-token prompts: " + ", ".join(
            f"{s} " + "/".join(f"{v['Plugin/LoRA'][s]:.3f}" for v in lengths.values()) for s in wave3.FLOPS_SHAPES)
            + " (exact)")
    if c.test == "nist":
        effects = [v["Plugin - NewModel NIST"] for v in result["per dataset"].values()]
        return (f"NIST higher on {len(result['higher on'])}/{len(effects)} datasets "
                f"({len(result['significantly higher on'])} significantly); Plugin - NewModel "
                f"{min(effects):+.2f} to {max(effects):+.2f}")
    per = result["per dataset"]
    judged = [d for d, v in per.items() if v != pre.NOT_MEASURABLE]
    return (f"the Plugin beats it: reproduced on {sum(per[d] == pre.REPRODUCED for d in judged)}/{len(judged)} "
            f"datasets where it learned" + "".join(f"; {d} {v}" for d, v in per.items() if v != pre.REPRODUCED))


def gather(roles: Roles, c: pre.Claim) -> None:
    """Raise Missing when a run the claim reads is not stored."""
    if c.test == "flops gap":
        return
    datasets = wave3.DATASETS if c.dataset == "all" else (c.dataset,)
    needs = {"nist": ("Plugin", "NewModel"), "weightedcomb": ("Plugin", "WeightedComb", "ProxyTuning")}
    for dataset in datasets:
        for label in needs.get(c.test, ("Plugin", *c.b)):
            roles.runs(dataset, label)


def status(profile: Profile | None = None) -> pd.DataFrame:
    """Per wave-3 claim: ready to judge, or what is missing."""
    roles = Roles(profile or load_profile(wave3.PROFILE))
    return claim_states(wave3.CLAIMS, lambda c: gather(roles, c))


def judge(profile: Profile | None = None, keys: Sequence[str] | None = None) -> list[dict]:
    """Record the verdict of every wave-3 claim whose runs are stored (or of ``keys``)."""
    profile = profile or load_profile(wave3.PROFILE)
    roles = Roles(profile)

    def judge_one(c) -> dict:
        gather(roles, c)
        return judge_claim(roles, c)

    def record(c, result: dict) -> dict:
        n = ({"inputs": None, "seeds": None} if c.test == "flops gap" else
             {"inputs": profile.rows.test, "seeds": len(profile.seeds)})
        return record_wave_claim(profile, wave3, c, result, claim_summary(c, result), frozen_at=freeze.WAVE3_FROZEN_AT,
                                 n=n, test_inputs=f"{profile.rows.test} per dataset, fresh (frozen with the rules)",
                                 confirmatory=c.key not in wave3.SEEN_BEFORE_FREEZE)

    return judge_each(wave3.CLAIMS, keys, judge_one, record)


def main(argv: Sequence[str] | None = None) -> None:
    command_line("wave3", argv)


if __name__ == "__main__":
    sys.exit(main())
