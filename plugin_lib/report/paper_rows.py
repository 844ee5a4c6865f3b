"""A row for every claim the paper makes (issue 45, item 4), beyond the preregistered ones.

Three kinds of row, each labelled in the README and REPORT.md:

- **exploratory**: claims judged on the confirmation's stored results. Their rules below were
  written on 2026-11-27, after those numbers were visible, so the verdicts are exploratory, never
  confirmatory:
  - NewModel occasionally achieves a higher NIST;
  - WeightedComb does not perform well;
  - the FLOPs gap narrows or inverts with the model configuration.
- **wave 2**: claims that need new runs at CPU scale. Their rules were frozen in a commit of
  their own before the first run (``report.preregistered_wave2``, docs/preregistration.md); a
  row shows its group's judged claims (``plugin-repro confirmation wave2 judge``).
- **paper profile only**: claims whose runs exceed the CPU budget. The row says why.

``plugin-repro report rows`` judges the exploratory rows from
``results/confirm/claims`` (and exact FLOP counts) into ``results/confirm/exploratory/``.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from ..harness import machine
from ..harness import profile as config
from ..utils.io import atomic_write_json, read_json
from . import freeze, mixed, wave3_rows, wave4_rows
from . import preregistered_wave2 as wave2
from . import preregistered_wave3 as wave3
from . import preregistered_wave4 as wave4
from .verdicts import DIRECTION_ONLY, NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED

EXPLORATORY, WAVE_2, WAVE_3, WAVE_4, PAPER_ONLY = "exploratory", "wave 2", "wave 3", "wave 4", "paper profile only"
FOLDER = "exploratory"
RULES_WRITTEN = "2026-11-27, after the confirmation's numbers were visible: exploratory"
DATASETS = ("e2e", "webnlg", "commongen", "adidas")
OTHER_THREE = "WebNLG, CommonGen, Adidas"
# The configurations of the FLOPs claim: the paper's three bases, by their shape twins' exact
# configurations (weights do not change FLOPs), each with its family's reweighting model.
FLOPS_SHAPES = ("gpt2-medium", "gpt2-xl", "llama-3.1-8b")

RULES = {
    "newmodel_nist": (
        "From each dataset's frozen main-table comparison of the Plugin against NewModel (two-level paired "
        "bootstrap, Holm over the four bootstrap metrics): NewModel's NIST is significantly higher where the "
        "reverse test gives Holm p < 0.05 with the 95% interval below zero (report.mixed). Reproduced: significantly "
        "higher on at least one dataset, while there the Plugin is ahead on most of the other six metrics (the "
        "paper's 'at the cost of coherence'); direction only: a higher NIST mean on at least one dataset; else not "
        "reproduced."),
    "weightedcomb_poor": (
        "From each dataset's frozen main-table comparison of the Plugin against WeightedComb (the superiority "
        "rule of report.preregistered): reproduced when the Plugin is significantly better on all four datasets; "
        "direction only when it is at least ahead on all four; else not reproduced."),
    "flops_configurations": (
        "Exact decoding FLOPs (torch's FLOP counter, 64 new tokens, prompt of 1 token; harness.flops) of the "
        "Plugin (base + its family's 1-layer reweighting model) and of rank-8 LoRA, unmerged, on the shapes of "
        "GPT2-M, GPT2-XL and LLaMA-3.1-8B. Reproduced when some configuration's Plugin/LoRA ratio is below GPT2-XL's "
        "(the gap narrows) or below 1 (it inverts); else not reproduced. A count has no sampling error."),
}


@dataclass(frozen=True)
class PaperRow:
    key: str
    claim: str
    kind: str
    why: str = ""
    group: str = ""  # a wave-2 row: its group of claims (``preregistered_wave2.GROUPS``)
    wave3: str = ""  # the group of wave 3 that judges it (``preregistered_wave3.GROUPS``)
    wave4: str = ""  # a wave-4 row: its group (``preregistered_wave4.GROUPS``)


ROWS = (
    PaperRow("newmodel_nist", "NewModel occasionally achieves a higher NIST than the Plugin", EXPLORATORY,
             wave3="newmodel_nist"),
    PaperRow("weightedcomb_poor", "WeightedComb does not perform well", EXPLORATORY, wave3="weightedcomb_poor"),
    PaperRow("flops_configurations", "the FLOPs gap to LoRA narrows or inverts with the model configuration",
             EXPLORATORY, wave3="flops_configurations"),
    # Wave 3's arms are not the published pairing (a pretrained small model, tuned and untuned):
    # the row says which they are (docs/preregistration.md, errata).
    PaperRow("proxy_tuning", "beyond the paper: the Plugin beats proxy-tuning with the same small model (4 datasets; "
             "a from-scratch expert, a uniform anti-expert)", WAVE_3, wave3="proxy_tuning"),
    PaperRow("dexperts", "beyond the paper: the Plugin beats DExperts with the same small model (4 datasets; the same "
             "experts)", WAVE_3, wave3="dexperts"),
    PaperRow("table5_other_three", f"Table 5 on {OTHER_THREE}: BDPL + Plugin beats BDPL and the Plugin, the Plugin "
             "beats BDPL", WAVE_2, group="table5"),
    PaperRow("table8_lora_other_three", f"Table 8's LoRA rows on {OTHER_THREE}: the Plugin is as good as LoRA", WAVE_2,
             group="table8_lora"),
    PaperRow("complexity_other_three", f"Figure 3's trend on {OTHER_THREE}: more layers do not help", WAVE_2,
             group="complexity"),
    # Wave 4: proxy-tuning's published pairing, and Figures 2 and 3 on the other three datasets.
    PaperRow("proxy_same_model", "beyond the paper: the Plugin from a pretrained small model beats proxy-tuning and "
             "DExperts as published (4 datasets; at CPU scale the base's first 4 blocks)", WAVE_4, wave4="proxy_same_model"),
    PaperRow("proxy_one_layer", "beyond the paper: the 1-layer Plugin beats proxy-tuning and DExperts as published "
             "(4 datasets)", WAVE_4, wave4="proxy_one_layer"),
    PaperRow("base_quality_other_three", f"Figure 2's trend on {OTHER_THREE}: the Plugin improves with the base",
             WAVE_4, wave4="base_quality"),
    PaperRow("plugin_beats_base_other_three", f"Figure 2 on {OTHER_THREE}: the Plugin beats the base alone on every "
             "base", WAVE_4, wave4="plugin_beats_base"),
    PaperRow("pretrained_other_three", f"Figure 3 on {OTHER_THREE}: pretrained initialisation helps (the base's first "
             "4 blocks)", WAVE_4, wave4="pretrained_init"),
)
# The README's one row for wave 4 while none of its groups is judged (REPORT.md shows each).
WAVE_4_WAITING = ("beyond the paper: proxy-tuning and DExperts as published (4 datasets); Figures 2 and 3 on "
                  f"{OTHER_THREE} (5 rows, {len(wave4.CLAIMS)} claims)")


def wave_row(root: Path, row: PaperRow) -> tuple[str, str]:
    """(verdict, statistic) of a row of waves 2 to 4 ("" while its group is not all judged)."""
    if row.kind == WAVE_2:
        return wave2_row(root, row)
    return wave3_rows.row(row.wave3) if row.kind == WAVE_3 else wave4_rows.row(row.wave4)


def _comparison(claims: dict, dataset: str, versus: str) -> dict | None:
    claim = claims.get(f"main_{dataset}")
    if claim is None:
        return None
    for comparison in claim["statistic"]["result"]["comparisons"]:
        if comparison.get("versus") == f"vs {versus}":
            return comparison
    return None


def judge_newmodel_nist(claims: dict) -> dict:
    per, higher, significant = {}, [], []
    for d in DATASETS:
        c = _comparison(claims, d, "NewModel")
        if c is None:
            continue
        per[d] = {"Plugin - NewModel NIST": c["effect"]["NIST"], "ci95": c["ci95"].get("NIST")}
        if c["effect"]["NIST"] < 0:
            higher.append(d)
            others = [m for m in c["ahead on"] if m != "NIST"]
            if "NIST" in mixed.deficits(c) and len(others) > 3:
                significant.append(d)
    verdict = REPRODUCED if significant else DIRECTION_ONLY if higher else NOT_REPRODUCED
    effects = [v["Plugin - NewModel NIST"] for v in per.values()]
    summary = (f"NIST higher on {len(higher)}/{len(per)} datasets ({len(significant)} significantly); Plugin - NewModel "
               f"{min(effects):+.2f} to {max(effects):+.2f}") if per else "no main-table runs"
    return {"verdict": verdict, "ours": summary, "statistic": {"summary": summary, "per dataset": per}}


def judge_weightedcomb(claims: dict) -> dict:
    per = {d: c["verdict"] for d in DATASETS if (c := _comparison(claims, d, "WeightedComb")) is not None}
    if len(per) < len(DATASETS):
        verdict = NOT_REPRODUCED if per else NOT_MEASURABLE
    elif all(v == REPRODUCED for v in per.values()):
        verdict = REPRODUCED
    elif all(v in (REPRODUCED, DIRECTION_ONLY) for v in per.values()):
        verdict = DIRECTION_ONLY
    else:
        verdict = NOT_REPRODUCED
    summary = (f"the Plugin beats it: reproduced on {sum(v == REPRODUCED for v in per.values())}/{len(per)} "
               "datasets" + "".join(f"; {d} {v}" for d, v in per.items() if v != REPRODUCED))
    return {"verdict": verdict, "ours": summary, "statistic": {"summary": summary, "per dataset": per}}


def judge_flops(shapes=FLOPS_SHAPES, reference: str = "gpt2-xl") -> dict:
    from ..harness import flops

    counts = {name: flops.shape_comparison(name) for name in shapes}
    ratios = {name: Fraction(c["plugin_flops"], c["lora_flops"]) for name, c in counts.items()}
    narrower = [n for n, r in ratios.items() if r < ratios[reference] or r < 1]
    verdict = REPRODUCED if narrower else NOT_REPRODUCED
    summary = "Plugin/LoRA: " + ", ".join(f"{n} {float(r):.4f}" for n, r in ratios.items())
    return {"verdict": verdict, "ours": summary,
            "statistic": {"summary": summary + " (exact counts)", "counts": counts,
                          "narrower than " + reference: narrower}}


def judge(profile: str = "confirm", shapes=FLOPS_SHAPES) -> list[dict]:
    """Judge the exploratory rows on ``profile``'s stored claims; write and return them."""
    prof = config.load_profile(profile)
    root = machine.results_dir(prof)
    claims = {p.stem: read_json(p) for p in sorted((root / "claims").glob("main_*.json"))}
    n = {"inputs": prof.rows.test, "seeds": len(prof.seeds)}
    judged = {"newmodel_nist": judge_newmodel_nist(claims), "weightedcomb_poor": judge_weightedcomb(claims),
              "flops_configurations": judge_flops(shapes)}
    out = []
    for row in ROWS:
        if row.key not in judged:
            continue
        entry = {"key": row.key, "claim": row.claim, "kind": EXPLORATORY, "rule": RULES[row.key],
                 "rule written": RULES_WRITTEN, "scope": "paper", **judged[row.key]}
        entry["statistic"]["n"] = n if row.key != "flops_configurations" else {"inputs": None, "seeds": None}
        atomic_write_json(root / FOLDER / f"{row.key}.json", entry)
        out.append(entry)
    return out


def load(root: Path) -> dict[str, dict]:
    return {p.stem: read_json(p) for p in sorted((root / FOLDER).glob("*.json"))}


def wave2_judged(root: Path, group: str | None = None) -> dict[str, dict]:
    """The stored records of wave 2's judged claims (of one row's ``group``, or all)."""
    keys = [c.key for c in wave2.CLAIMS if group is None or wave2.group(c) == group]
    return {k: read_json(path) for k in keys if (path := root / "claims" / f"{k}.json").exists()}


def _counts(verdicts: list[str]) -> str:
    return ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))


def wave2_row(root: Path, row: PaperRow) -> tuple[str, str]:
    """(verdict, statistic) of a wave-2 row from its group's judged claims; ("", what is left) before."""
    keys = [c.key for c in wave2.CLAIMS if wave2.group(c) == row.group]
    judged = wave2_judged(root, row.group)
    if not judged:
        return "", f"rules frozen at {freeze.WAVE2_FROZEN_AT[:7]}; runs under way"
    verdicts = [c["verdict"] for c in judged.values()]
    counts = _counts(verdicts)
    flagged = mixed.group_flag(judged, {c.key: c.dataset for c in wave2.CLAIMS})
    statistic = (f"{len(judged)}/{len(keys)} claims judged: {counts}" + (f"; {flagged}" if flagged else "")
                 + (f"; {len(keys) - len(judged)} waiting" if len(judged) < len(keys) else ""))
    verdict = wave2.row_verdict(verdicts) if len(judged) == len(keys) else ""
    return verdict, statistic


def table_rows(root: Path) -> list[str]:
    """The README's rows for these claims: | claim | statistic | confirmatory | exploratory |."""
    judged = load(root)
    lines = []
    waiting = not any(wave4_rows.judged(group=row.wave4) for row in ROWS if row.kind == WAVE_4)
    for row in ROWS:
        if row.kind == WAVE_4 and waiting:
            if row is next(r for r in ROWS if r.kind == WAVE_4):
                lines.append(f"| {WAVE_4_WAITING} | {wave4_rows.under_way()} | *wave 4* | - |")
            continue
        if row.kind == EXPLORATORY:
            found = judged.get(row.key)
            statistic = found["statistic"]["summary"] if found else ""
            explored = found["verdict"] if found else "*not yet judged*"
            again, again_statistic = wave3_rows.row(row.wave3)
            if not again:
                confirmatory = "*wave 3 under way*"
            elif wave3_rows.seen_before_freeze(row.wave3):  # judged by wave 3's rule, but not confirmatory
                confirmatory, explored, statistic = "*exploratory only*", f"{explored}; wave 3: {again}", again_statistic
            else:
                confirmatory, statistic = f"**{again}** (wave 3)", again_statistic
            lines.append(f"| {row.claim} | {statistic} | {confirmatory} | {explored} |")
        elif row.kind in (WAVE_2, WAVE_3, WAVE_4):
            verdict, statistic = wave_row(root, row)
            lines.append(f"| {row.claim} | {statistic} | {f'**{verdict}** ({row.kind})' if verdict else f'*{row.kind}*'} "
                         "| - |")
        else:
            lines.append(f"| {row.claim} | {row.why} | *`paper` profile only* | - |")
    return lines


def exploratory_only(root: Path) -> list[str]:
    """The exploratory rows with no confirmatory verdict: wave 3 has not judged them, or saw
    their numbers before its freeze."""
    judged = load(root)
    return [r.key for r in ROWS if r.kind == EXPLORATORY and r.key in judged
            and (not wave3_rows.row(r.wave3)[0] or wave3_rows.seen_before_freeze(r.wave3))]


def count_line(root: Path) -> str:
    judged, only = load(root), exploratory_only(root)
    again = [r.key for r in ROWS if r.kind == EXPLORATORY and r.key in judged and r.key not in only]
    kinds = [r.kind for r in ROWS]
    waves = [wave2_row(root, r)[0] for r in ROWS if r.kind == WAVE_2]
    claims = [c["verdict"] for c in wave2_judged(root).values()]
    verdicts = _counts(claims)
    return (f"The paper's other claims: {len(only)} exploratory only (rules written after the confirmation's "
            f"numbers{'' if not again else f'; {len(again)} more judged again by wave 3'}); {len(waves)} rows in wave 2 ({len(wave2.CLAIMS)} claims, rules frozen "
            f"at {freeze.WAVE2_FROZEN_AT[:7]} before its runs): {len(claims)} claims judged"
            f"{f' ({verdicts})' if claims else ''}{'' if all(waves) else f', {sum(map(bool, waves))} of {len(waves)} rows complete'}"
            + (f"; {kinds.count(PAPER_ONLY)} not run at CPU scale (`paper` only). " if PAPER_ONLY in kinds else ". ")
            + f"{wave3_rows.count_line()} {wave4_rows.count_line()}")


def print_judged(profile: str) -> None:
    """Each row judged on ``profile``'s runs, printed (``plugin-repro report rows``)."""
    for entry in judge(profile):
        print(f"{entry['key']}: {entry['verdict']} ({entry['statistic']['summary']})")


def report_section(root: Path) -> list[str]:
    """REPORT.md's section on these claims: each row, its rule (and when it was written) and statistic."""
    judged = load(root)
    lines = ["## The paper's other claims", "",
             "Rows for the paper's claims that have no preregistered rule. *Exploratory*: judged on this profile's "
             f"runs by rules written on {RULES_WRITTEN}. *Wave 2*, *wave 3*: rules frozen before their runs "
             "(docs/preregistration.md); wave 3 judges the three exploratory claims again, on fresh inputs, and the "
             "Plugin against proxy-tuning and DExperts with a from-scratch expert (`results/wave3/claims`); wave 4 the "
             "published pairing, and Figures 2 and 3 on the other three datasets (`results/wave4/claims`). *Paper "
             "profile only*: not run at CPU scale.", "",
             "| claim | kind | verdict | statistic |", "| --- | --- | --- | --- |"]
    for row in ROWS:
        found = judged.get(row.key)
        verdict = found["verdict"] if found else ("-" if row.kind != EXPLORATORY else "not yet judged")
        statistic = found["statistic"]["summary"] if found else row.why
        if row.kind in (WAVE_2, WAVE_3, WAVE_4):
            verdict, statistic = wave_row(root, row)
            verdict = verdict or "-"
        lines.append(f"| {row.claim} | {row.kind} | {verdict} | {statistic} |")
    lines.append("")
    for row in ROWS:
        if row.key in RULES:
            lines.append(f"- **{row.claim}** ({EXPLORATORY}): {RULES[row.key]}")
    for group, claim in wave3.GROUPS.items():  # each group's rule, as frozen (the datasets' claims share one)
        first = next(c for c in wave3.CLAIMS if wave3.group(c) == group)
        lines.append(f"- **{claim}** (wave 3, frozen at {freeze.WAVE3_FROZEN_AT[:7]}"
                     f"{'; seen before the freeze: exploratory' if first.key in wave3.SEEN_BEFORE_FREEZE else ''}): "
                     f"{wave3.rule_text(first)}")
    for group, claim in wave4.GROUPS.items():
        first = next(c for c in wave4.CLAIMS if wave4.group(c) == group)
        lines.append(f"- **{claim}** (wave 4, frozen at {freeze.WAVE4_FROZEN_AT[:7]}): {wave4.rule_text(first)}")
    return lines + [""]
