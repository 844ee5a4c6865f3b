"""The reproduction report, ``results/<profile>/REPORT.md``, and the README's results block
(``plugin-repro report --profile NAME [--readme]``: ``commands.report``).

``write_report`` gathers every claim (``report.claims``), then one section per study of the
registry (``commands.studies``: its title and the tables and figures its notebook wrote), and
the wall time of each notebook into one Markdown page; ``plugin-repro run`` writes it at the end.
It sits with the commands, above the studies it lays out; the pieces it assembles (claim tables,
statistics, verdicts) are the report layer's.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

from ..experiments import confirmation
from ..harness import models
from ..harness import machine
from ..harness import profile as config
from ..harness.profile import Profile
from ..report import bdpl_reach, freeze, paper_rows, preregistered, preregistered_wave2, wave3_rows, wave4_rows
from ..report import preregistered_wave3 as wave3
from ..report import preregistered_wave4 as wave4
from ..report.claim_tables import (PREREGISTERED_LEGEND, SCOPE_TITLES, VERDICT_LEGEND, claims_table, margin_section,
                                   scope_of, shown_verdict, statistic_summary, tally)
from ..report.claims import SCOPES, load_claims, n_seeds
from ..report.code_versions import code_versions_section
from ..utils.io import atomic_write_text, read_json
from . import studies

README_START = "<!-- results:start (written by plugin-repro report --readme; do not edit) -->"
README_END = "<!-- results:end -->"


def times_table(root: Path) -> list[str]:
    """Wall time per notebook (run_all.sh writes one line per execution to
    ``executed/<name>.seconds``; a later execution reuses the stored runs, so the first one
    usually dominates). Kept apart from the report, in TIMES.md: re-executing changes the times,
    never the results. Empty where no notebook has run."""
    rows = []
    for path in sorted((root / "executed").glob("*.seconds")):
        times = [float(line) for line in path.read_text().split()]
        if times:
            rows.append(f"| {path.stem} | {len(times)} | {sum(times) / 60:.1f} | {times[-1]:.0f} |")
    return ["| notebook | executions | total (min) | last (s) |", "| --- | ---: | ---: | ---: |", *rows] if rows else []


def _figures(root: Path, stems: list[str]) -> list[Path]:
    return sorted(p for stem in stems for p in (root / "figures").glob(f"{stem}*.png"))


# Rows of a Markdown table shown in the report; a longer one is cut there, with a link to its CSV.
MAX_TABLE_ROWS = 20


def _table(table: Path) -> list[str]:
    """A table's Markdown, its first MAX_TABLE_ROWS rows where it has more (notebook 9's
    decoding trace has thousands), then where the whole table is."""
    lines = table.read_text(encoding="utf-8").strip().splitlines()
    body = list(itertools.takewhile(lambda line: line.startswith("|"), lines))  # a caption may follow
    rows = len(body) - 2  # below the header and its rule
    if rows <= MAX_TABLE_ROWS:
        return lines
    full = table.with_suffix(".csv") if table.with_suffix(".csv").exists() else table
    return [*body[: 2 + MAX_TABLE_ROWS], "", f"The first {MAX_TABLE_ROWS} of {rows:,} rows; the whole table: "
            f"[tables/{full.name}](tables/{full.name}).", *lines[len(body):]]


def _skips(root: Path, stems: list[str]) -> list[str]:
    """Why the notebook ran but skipped what would have written these results (writer.save_skip)."""
    records = sorted(p for stem in stems for p in (root / "skipped").glob(f"{stem}*.json"))
    return [f"The notebook ran in this profile and skipped `{r['name']}`: {r['reason']}"
            for r in map(read_json, records)]


def _outputs(root: Path, study: studies.Study) -> tuple[list[Path], list[Path], list[str]]:
    """What the notebook left here: its tables, its figures, and what it skipped (all empty: it has not run)."""
    stems = list(study.results)
    return (sorted(p for stem in stems for p in (root / "tables").glob(f"{stem}*.md")), _figures(root, stems),
            _skips(root, stems))


# The notebooks whose results a preregistered profile's claims read; in that profile, another
# notebook's tables are exploratory, and its section says so.
def _judged_notebooks(prof: Profile) -> frozenset[str] | None:
    """The prefixes of the notebooks its claims read, or None for a profile without preregistration."""
    if prof.test_inputs is None:
        return None
    claims = {freeze.FROZEN_PROFILE: (*preregistered.CLAIMS, *preregistered_wave2.CLAIMS),
              wave3.PROFILE: wave3.CLAIMS, freeze.WAVE4_PROFILE: wave4.CLAIMS}.get(prof.name, ())
    return frozenset(claim.notebook for claim in claims)


UNJUDGED = ("**Exploratory here.** No preregistered claim of this profile reads this notebook's results: they "
            "describe or explore, and confirm nothing ([docs/preregistration.md](../../docs/preregistration.md)).")


def _section(study: studies.Study, tables: list[Path], figures: list[Path], skips: list[str],
             judged: frozenset[str] | None = None) -> list[str]:
    lines = [f"## {study.title}", "", f"Notebook `notebooks/{study.prefix}_*.ipynb` (its wall time: [TIMES.md](TIMES.md)).",
             ""]
    lines += [line for skip in skips for line in (skip, "")]
    if not tables and not figures:
        return lines + ([] if skips else ["No results yet: the notebook has not run in this profile.", ""])
    if judged is not None and study.prefix not in judged:
        lines += [UNJUDGED, ""]
    for table in tables:
        lines += [f"**{table.stem}**", "", *_table(table), ""]
    for figure in figures:
        lines += [f"![{figure.stem}](figures/{figure.name})", ""]
    return lines


# Controls run after the numbers they explain were seen (``experiments.main_tables``): no rule
# judges them, and the report says so.
CONTROLS = ["sampled_base", "icl_copying"]


def _controls_section(root: Path) -> list[str]:
    tables = sorted(p for stem in CONTROLS for p in (root / "tables").glob(f"{stem}_*.md"))
    if not tables:
        return []
    lines = ["## Exploratory controls", "",
             "Run after the numbers they explain were seen, so exploratory: why TempNet and ICL score below "
             "Zeroshot on some datasets (`plugin-repro report controls sampled-base|icl-copying "
             "--profile NAME --datasets ...`; read in [docs/preregistration.md](../../docs/preregistration.md)).", ""]
    for table in tables:
        lines += [f"**{table.stem}**", "", *_table(table), ""]
    return lines


EXPLORATORY = (
    "**Exploratory.** These rules were written in code on 2026-11-23 (commit 2ee9b82), after the local results "
    "they judge were first committed (2026-11-22), and two verdicts moved with them; so they are not evidence "
    "that a skeptic need accept. The preregistered confirmation re-tests every claim on fresh test inputs under "
    "rules frozen in git before its numbers ([docs/preregistration.md](../../docs/preregistration.md))."
)


# A preregistered profile: (its rules' file, the commit that froze them, the test of that history).
FREEZES = {freeze.FROZEN_PROFILE: ("preregistered.py", freeze.FROZEN_AT, "test_preregistration.py"),
           wave3.PROFILE: ("preregistered_wave3.py", freeze.WAVE3_FROZEN_AT, "test_preregistration_wave3.py"),
           freeze.WAVE4_PROFILE: ("preregistered_wave4.py", freeze.WAVE4_FROZEN_AT, "test_preregistration_wave4.py")}


# The waves whose runs only the grid computes, the units their claims read (no notebook runs there).
GRID_WAVES = {wave3.PROFILE: wave3.WAVE, wave4.PROFILE: wave4.WAVE}


def fresh_inputs(prof: Profile) -> str:
    """How many frozen test inputs a preregistered profile has: "200 per dataset", or per dataset
    where they differ (wave 4's Adidas had 54 left that no earlier profile decoded)."""
    try:
        counts = {d: v["n"] for d, v in confirmation.frozen_inputs(prof.name).items()}
    except ValueError:  # a profile with fresh inputs but no frozen file yet
        return f"{prof.rows.test} per dataset"
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values()))} per dataset"
    return ", ".join(f"{n} on {d}" for d, n in counts.items())


def preregistered_note(prof: Profile) -> str:
    """What makes a preregistered profile's verdicts confirmatory, with the freezing commit."""
    rules, commit, test = FREEZES.get(prof.name, FREEZES[freeze.FROZEN_PROFILE])
    seen = [c.claim for c in wave3.CLAIMS if c.key in wave3.SEEN_BEFORE_FREEZE] if prof.name == wave3.PROFILE else []
    return (f"**Preregistered.** Every verdict below follows a rule of `plugin_lib/report/{rules}`, frozen in "
            f"git with this profile's settings and its fresh test inputs ({fresh_inputs(prof)}, never decoded "
            f"by an earlier profile) in commit `{(commit or 'not yet frozen')[:10]}`, before any of these "
            f"numbers existed; `tests/{test}` checks that history "
            "([docs/preregistration.md](../../docs/preregistration.md))."
            + "".join(f" Exploratory, not confirmatory: *{claim}*, whose numbers were seen before the freeze "
                      "(its own table below)." for claim in seen))


def _twin_note(prof: Profile) -> list[str]:
    """A warning above the verdicts of a profile whose bases are shape twins."""
    twins = [m for m in prof.base_models if models.is_twin(m)]
    if not twins:
        return []
    return [f"**{models.TWIN_LABEL}.** The bases {', '.join(twins)} are shape twins of the paper's models: "
            "random weights of their architectures, with the offline SmolLM2 tokenizer. This profile "
            "checks that the paper profile's code path runs; its outputs and verdicts carry no "
            "information about the paper's claims.", ""]


WAVE2_KEYS = frozenset(c.key for c in preregistered_wave2.CLAIMS)


def first_wave(claims: list[dict]) -> list[dict]:
    """The claims of the first preregistered wave (or of any other profile): all but wave 2's."""
    return [c for c in claims if c["key"] not in WAVE2_KEYS]


def wave2_section(claims: list[dict], root: Path) -> list[str]:
    """REPORT.md's section of the second wave's judged claims, apart from the first wave's, with
    the margin sensitivity of its null claims."""
    second = [c for c in claims if c["key"] in WAVE2_KEYS]
    if not second:
        return []
    judged = {c["key"] for c in second}
    waiting = [c for c in preregistered_wave2.CLAIMS if c.key not in judged]
    return ["## Wave 2: the paper's claims that had no row", "",
            f"Rules frozen in `{freeze.WAVE2_FROZEN_AT[:7]}` (`report.preregistered_wave2`) before any of their runs, "
            f"judged on the same frozen test inputs; {len(second)} of {len(WAVE2_KEYS)} claims judged so far.", "",
            *([f"Not judged yet, {len(waiting)} (their runs are not all stored; `plugin-repro confirmation wave2 "
               "status` names what is missing):", "",
               *(f"- {c.claim} (notebook {c.notebook}; `{c.key}`)" for c in waiting), ""]
              if waiting else []),
            *claims_table(second, PREREGISTERED_LEGEND),
            *margin_section(root, "margin_sensitivity_wave2.json", "plugin-repro confirmation wave2 margins")]


def wave3_section(claims: list[dict]) -> list[str]:
    """The wave3 profile's report: its tally as the README states it, and the claims whose
    numbers were seen before the freeze, apart, as exploratory."""
    seen = [c for c in claims if c["key"] in wave3.SEEN_BEFORE_FREEZE]
    return [wave3_rows.count_line(), "",
            *(["## Exploratory: numbers seen before the freeze", "", *claims_table(seen, VERDICT_LEGEND)] if seen else [])]


def write_report(profile: Profile | str) -> Path:
    """REPORT.md and TIMES.md of the profile, from its results as they stand."""
    prof = config.load_profile(profile)
    root = machine.results_dir(prof)
    table = times_table(root)
    times = [f"# Wall times: profile `{prof.name}`", "", "Measured by run_all.sh on the machine that ran each "
             "notebook; kept apart from REPORT.md, whose results do not change when a notebook is re-executed.",
             "", *(table or ["No notebook has run in this profile."])]
    if prof.name in GRID_WAVES:  # its compute is in its run records instead
        times += ["", f"Wave {GRID_WAVES[prof.name]}'s units store their own process-hours: `plugin-repro grid plan "
                  f"--profile {prof.name} --wave {GRID_WAVES[prof.name]} --summary` sums them."]
    atomic_write_text(root / "TIMES.md", "\n".join(times) + "\n")
    return atomic_write_text(root / "REPORT.md", report_text(prof))


def report_text(prof: Profile) -> str:
    """REPORT.md's text: a committed report is current when it is this (tests/test_committed_results.py)."""
    root = machine.results_dir(prof)
    lines = [
        f"# Reproduction report: profile `{prof.name}`",
        "",
        f"Every number below was produced by {_producer(prof)} in this profile "
        f"(base models: {', '.join(prof.base_models)}; seeds: {list(prof.seeds)}; rows per split: "
        f"{json.dumps(prof.section('rows'))}). The paper's numbers are quoted beside ours where a notebook "
        "compares them.",
        "",
        *_twin_note(prof),
        "## Claim-by-claim verdicts",
        "",
        *([EXPLORATORY, ""] if prof.name == "local" else []),
        *([preregistered_note(prof), ""] if prof.test_inputs is not None else []),
        *claims_table([c for c in first_wave(load_claims(prof)) if c["key"] not in wave3.SEEN_BEFORE_FREEZE],
                      PREREGISTERED_LEGEND if prof.test_inputs is not None else VERDICT_LEGEND),
        *(wave3_section(load_claims(prof)) if prof.name == wave3.PROFILE else []),
        *([wave4_rows.count_line(), ""] if prof.name == freeze.WAVE4_PROFILE else []),
        *margin_section(root),
        *(paper_rows.report_section(root) if prof.name == freeze.FROZEN_PROFILE else []),
        *wave2_section(load_claims(prof), root),
    ]
    shown = {study: _outputs(root, study) for study in studies.STUDIES}
    idle = [study.prefix for study, outputs in shown.items() if not any(outputs)]
    if prof.name in GRID_WAVES and idle:  # a notebook that did not run here gets one line, not a section
        shown = {study: outputs for study, outputs in shown.items() if any(outputs)}
        which = "None of the notebooks" if len(idle) == len(studies.STUDIES) else f"Notebooks {', '.join(idle)}"
        lines += ["## The notebooks", "", f"{which} ran in this profile. Wave {GRID_WAVES[prof.name]} "
                  "computes only the units its claims read (`plugin-repro grid run --profile "
                  f"{prof.name} --wave {GRID_WAVES[prof.name]}`), whose records the verdicts above are judged from.", ""]
    judged = _judged_notebooks(prof)
    lines += [line for study, outputs in shown.items() for line in _section(study, *outputs, judged)]
    lines += _controls_section(root)
    lines += code_versions_section(root)
    return "\n".join(lines) + "\n"


def _producer(prof: Profile) -> str:
    if prof.name in GRID_WAVES:
        return f"this repository's code (the notebooks' units that wave {GRID_WAVES[prof.name]}'s claims read)"
    return "the notebooks of this repository"


def _scale(prof: Profile) -> str:
    return (f"base: {', '.join(prof.base_models)}; seeds {list(prof.seeds)}; at most {prof.rows.validation} "
            f"validation and {prof.rows.test} test inputs per dataset")


# A row's text where the frozen claim's own words leave out what a reader needs (the rules file
# is frozen; the README's label is not): the stand-in that CPU scale tests.
ROW_LABELS = {"complexity_e2e_2": "pretrained init (a truncated copy of the base, not GPT2-Small) helps"}


def confirmed_block(local: Profile, explored: list[dict], confirm: Profile, confirmed: list[dict]) -> list[str]:
    """The README's results once the preregistered confirmation has verdicts: per claim of the
    paper its confirmatory statistic and verdict (or that it waits for its runs), with the
    exploratory verdict beside it; the tallies of both; links to both reports."""
    frozen = (freeze.FROZEN_AT or "not yet frozen")[:7]
    # Until every notebook of the confirmation has run there is no REPORT.md to link: the claims
    # are judged as their runs complete (docs/preregistration.md).
    report = (machine.results_dir(confirm) / "REPORT.md").exists()
    where = (f"[`results/{confirm.name}/REPORT.md`](results/{confirm.name}/REPORT.md)" if report else
             "under way, judged as its runs complete ([docs/preregistration.md](docs/preregistration.md))")
    lines = [f"**Confirmatory**: the `{confirm.name}` profile on a 2-core CPU ({_scale(confirm)}, "
             f"never decoded by `{local.name}`), judged by rules frozen in git in `{frozen}` before these numbers: "
             f"{where}. **Exploratory**: the "
             f"`{local.name}` profile ({_scale(local)}), judged by rules written after its numbers: "
             f"[`results/{local.name}/REPORT.md`](results/{local.name}/REPORT.md).", ""]
    confirmed = first_wave(confirmed)  # wave 2's claims have rows of their own (report.paper_rows)
    by_key = {c["key"]: c for c in confirmed}
    before = {c["key"]: c for c in explored}
    # Most statistics end with the profile's full scale; said once above the table instead.
    full_scale = f"; {confirm.rows.test} inputs, {n_seeds(len(confirm.seeds))}"
    lines += [f"Each confirmatory statistic is on all {confirm.rows.test} test inputs and "
              f"{n_seeds(len(confirm.seeds))} unless it says otherwise.", "",
              "| the paper's claim | confirmatory statistic | confirmatory | exploratory |", "| --- | --- | --- | --- |"]
    previous = None
    for claim in (c for c in preregistered.CLAIMS if c.scope == "paper"):
        found, old = by_key.get(claim.key), before.get(claim.key)
        statistic, verdict = (statistic_summary(found), shown_verdict(found)) if found else ("", "*waiting for its runs*")
        statistic = statistic.removesuffix(full_scale)
        shown, previous = ("as above" if statistic and statistic == previous else statistic), statistic
        lines.append(f"| {ROW_LABELS.get(claim.key, claim.claim)} | {shown} | {verdict} | "
                     f"{old['verdict'] if old else '-'} |")
    lines += [*paper_rows.table_rows(machine.results_dir(confirm)), ""]
    reach = bdpl_reach.line(machine.results_dir(confirm))  # beside the "not measurable" Table 5 rows
    lines += [reach, ""] if reach else []
    for scope in SCOPES:
        now = [c for c in confirmed if scope_of(c) == scope]
        then = [c for c in explored if scope_of(c) == scope]
        waiting = sum(c.scope == scope for c in preregistered.CLAIMS) - len(now)
        lines += [f"{SCOPE_TITLES[scope]}, confirmatory ({len(now)}{f'; {waiting} waiting' if waiting else ''}): "
                  f"{tally(now)}. Exploratory ({len(then)}): {tally(then)}.", ""]
    # Each claim's frozen rule and full statistic: the two reports the first paragraph links.
    return lines + [paper_rows.count_line(machine.results_dir(confirm)), ""]


def readme_block(profile: Profile | str) -> list[str]:
    """The README's results: the scale, one table of the paper's claims (short statistic and
    verdict), the tally of each scope, and a link to REPORT.md, where every rule, statistic,
    table and figure is. Once the preregistered confirmation has verdicts in this checkout's
    results, they lead and the local profile's sit beside them (:func:`confirmed_block`)."""
    prof = config.load_profile(profile)
    claims = load_claims(prof)
    if prof.name == "local":
        confirm = config.load_profile(freeze.FROZEN_PROFILE)
        confirmed = load_claims(confirm)
        if confirmed:
            return confirmed_block(prof, claims, confirm, confirmed)
    lines = [
        f"Produced by `bash run_all.sh --profile {prof.name}` on a 2-core CPU ({_scale(prof)}). Every table, "
        f"figure and wall time: [`results/{prof.name}/REPORT.md`](results/{prof.name}/REPORT.md).",
        "",
    ]
    if not claims:
        return lines + ["No claim has been checked in this profile yet.", ""]
    paper = [c for c in claims if scope_of(c) == "paper"]
    if paper:
        lines += ["| the paper's claim | statistic | verdict |", "| --- | --- | --- |"]
        lines += [f"| {c['claim']} | {statistic_summary(c)} | {shown_verdict(c)} |" for c in paper]
        lines.append("")
    for scope in SCOPES:
        chosen = [c for c in claims if scope_of(c) == scope]
        lines.append(f"{SCOPE_TITLES[scope]} ({len(chosen)}): {tally(chosen)}." if chosen
                     else f"{SCOPE_TITLES[scope]}: none checked yet.")
        lines.append("")
    return lines + ["Each claim's rule and full statistic, and the checks beyond the paper, are in REPORT.md. "
                    "**Exploratory**: the rules came after these numbers; the preregistered confirmation: "
                    "[docs/preregistration.md](docs/preregistration.md).", ""]


def readme_text(profile: Profile | str, readme: Path = config.REPO_ROOT / "README.md") -> str:
    """The README with the block between README_START and README_END made ``readme_block``."""
    text = readme.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise ValueError(f"{readme} has no results block: add the lines {README_START!r} and {README_END!r}.")
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    return head + "\n".join([README_START, "", *readme_block(profile), README_END]) + tail


def update_readme(profile: Profile | str, readme: Path = config.REPO_ROOT / "README.md") -> Path:
    """Replace the README's results block with ``readme_block``."""
    return atomic_write_text(readme, readme_text(profile, readme))
