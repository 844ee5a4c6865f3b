"""The reproduction report, ``results/<profile>/REPORT.md``.

Notebooks state the paper's claims they test with :func:`record_claim`: the claim, the paper's
number, ours, and a verdict computed from the run (never typed in). ``write_report`` gathers
every table, figure, claim and the wall time of each notebook into one Markdown page;
``run_all.sh`` calls it at the end (``python -m plugin_lib.report --profile NAME``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import config
from .io import atomic_write_json, atomic_write_text, read_json

VERDICTS = ("reproduced", "not reproduced", "not measurable at this scale")

# Notebook stem prefix -> the paper item it reproduces, the result files it writes, and the
# tables the README shows (the ablations and top-k: their default dataset, E2E; REPORT.md has all).
SECTIONS = [
    ("00", "Dataset statistics (Table 7)", ["dataset_statistics"], []),
    ("01", "Main results, E2E NLG (Table 1)", ["main_e2e"], ["main_e2e_vs_paper"]),
    ("02", "Main results, WebNLG (Table 2)", ["main_webnlg"], ["main_webnlg_vs_paper"]),
    ("03", "Main results, CommonGen (Table 3)", ["main_commongen"], ["main_commongen_vs_paper"]),
    ("04", "Main results, Adidas (Table 4)", ["main_adidas"], ["main_adidas_vs_paper"]),
    ("05", "Plugin as a wrapper: BDPL and BDPL + Plugin (Table 5)", ["table5"], ["table5_bdpl_wrapper_vs_paper"]),
    ("06", "Base-model quality (Figures 2 and 5)", ["ablation_base_quality"], ["ablation_base_quality_e2e"]),
    ("07", "Reweighting-model complexity (Figures 3 and 6)", ["ablation_complexity"], ["ablation_complexity_e2e"]),
    ("08", "Reweighting-model architecture (Figure 7)", ["ablation_architecture"], ["ablation_architecture_e2e"]),
    ("09", "Adidas case study (Figures 4 and 8)", ["adidas"], ["adidas_coverage", "adidas_preference"]),
    ("10", "Distribution shift (Section 6.4)", ["shift"], ["shift_webnlg", "shift_commongen"]),
    ("11", "Plugin vs LoRA and FLOPs (Table 8)", ["table8"], ["table8_lora_vs_paper", "table8_flops"]),
    ("12", "Beyond the paper: top-k log-probability APIs", ["topk"], ["topk_e2e_residual", "topk_e2e_residual_gaps"]),
    ("13", "Theorem 1, measured", ["theorem1"], ["theorem1_slopes"]),
]
README_START = "<!-- results:start (written by python -m plugin_lib.report --readme; do not edit) -->"
README_END = "<!-- results:end -->"


def record_claim(profile: str, key: str, claim: str, paper: str, ours: str, verdict: str) -> dict:
    """Store one claim's verdict (``results/<profile>/claims/<key>.json``) and return it.

    The smoke profile only checks that code paths run (a handful of rows, one epoch), so its
    verdicts are always "not measurable at this scale", whatever the numbers say.
    """
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    if profile == "smoke":
        verdict = "not measurable at this scale"
    entry = {"key": key, "claim": claim, "paper": paper, "ours": ours, "verdict": verdict}
    atomic_write_json(config.results_dir(profile) / "claims" / f"{key}.json", entry)
    return entry


def majority_verdict(count: int, total: int) -> str:
    """'reproduced' when a property holds on more than half of the cases."""
    return "reproduced" if count * 2 > total else "not reproduced"


def load_claims(profile: str) -> list[dict]:
    folder = config.results_dir(profile) / "claims"
    return [read_json(p) for p in sorted(folder.glob("*.json"))]


def _notebook_seconds(root: Path, prefix: str) -> str:
    """Total wall time of a notebook's executions (run_all.sh writes one line per execution;
    a later execution reuses the stored runs, so the first one usually dominates)."""
    times = [float(line) for p in (root / "executed").glob(f"{prefix}_*.seconds")
             for line in p.read_text().split()]
    if not times:
        return "not recorded on this machine"
    runs = f" over {len(times)} executions" if len(times) > 1 else ""
    return f"{sum(times) / 60:.1f} min{runs}"


def _figures(root: Path, stems: list[str]) -> list[Path]:
    return sorted(p for stem in stems for p in (root / "figures").glob(f"{stem}*.png"))


def _section(root: Path, prefix: str, title: str, stems: list[str]) -> list[str]:
    lines = [f"## {title}", "", f"Notebook `notebooks/{prefix}_*.ipynb`; wall time {_notebook_seconds(root, prefix)}.", ""]
    tables = sorted(p for stem in stems for p in (root / "tables").glob(f"{stem}*.md"))
    figures = _figures(root, stems)
    if not tables and not figures:
        return lines + ["No results yet: the notebook has not run in this profile.", ""]
    for table in tables:
        lines += [f"**{table.stem}**", "", table.read_text(encoding="utf-8").strip(), ""]
    for figure in figures:
        lines += [f"![{figure.stem}](figures/{figure.name})", ""]
    return lines


def claims_table(claims: list[dict]) -> list[str]:
    if not claims:
        return ["No claim has been checked in this profile yet.", ""]
    lines = ["| claim | paper | ours | verdict |", "| --- | --- | --- | --- |"]
    for c in claims:
        lines.append(f"| {c['claim']} | {c['paper']} | {c['ours']} | **{c['verdict']}** |")
    counts = {v: sum(c["verdict"] == v for c in claims) for v in VERDICTS}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    return lines + ["", f"In all: {summary}.", ""]


def write_report(profile: str) -> Path:
    root = config.results_dir(profile)
    prof = config.load_profile(profile)
    lines = [
        f"# Reproduction report: profile `{profile}`",
        "",
        "Every number below was produced by the notebooks of this repository in this profile "
        f"(base models: {', '.join(prof['base_models'])}; seeds: {prof['seeds']}; rows per split: "
        f"{json.dumps(prof['rows'])}). The paper's numbers are quoted beside ours where a notebook "
        "compares them.",
        "",
        "## Claim-by-claim verdicts",
        "",
        *claims_table(load_claims(profile)),
    ]
    for prefix, title, stems, _ in SECTIONS:
        lines += _section(root, prefix, title, stems)
    return atomic_write_text(root / "REPORT.md", "\n".join(lines) + "\n")


def readme_block(profile: str) -> list[str]:
    """The README's results: the verdict list, then per notebook that has run its headline
    tables and first figure, with the scale and the wall time."""
    root = config.results_dir(profile)
    prof = config.load_profile(profile)
    lines = [
        f"Produced by `bash run_all.sh --profile {profile}` on a 2-core CPU (base: "
        f"{', '.join(prof['base_models'])}; seeds {prof['seeds']}; at most {prof['rows']['validation']} "
        f"validation and {prof['rows']['test']} test inputs per dataset). Full report with every "
        f"table and figure: [`results/{profile}/REPORT.md`](results/{profile}/REPORT.md).",
        "",
        "#### Claim-by-claim verdicts",
        "",
        *claims_table(load_claims(profile)),
    ]
    for prefix, title, stems, headline in SECTIONS:
        tables = [p for pattern in headline for p in sorted((root / "tables").glob(f"{pattern}.md"))]
        figures = _figures(root, stems)
        if not tables and not figures:
            lines += [f"#### {title}", "", "Not yet run in this profile.", ""]
            continue
        lines += [f"#### {title}", "", f"`notebooks/{prefix}_*`, wall time {_notebook_seconds(root, prefix)}.", ""]
        for table in tables:
            lines += [table.read_text(encoding="utf-8").strip(), ""]
        if figures:
            lines += [f"![{figures[0].stem}](results/{profile}/figures/{figures[0].name})", ""]
    return lines


def update_readme(profile: str, readme: Path = config.REPO_ROOT / "README.md") -> Path:
    """Replace the block between README_START and README_END with ``readme_block``."""
    text = readme.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise ValueError(f"{readme} has no results block: add the lines {README_START!r} and {README_END!r}.")
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    block = "\n".join([README_START, "", *readme_block(profile), README_END])
    return atomic_write_text(readme, head + block + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description="Write results/<profile>/REPORT.md")
    parser.add_argument("--profile", required=True, choices=config.PROFILE_NAMES)
    parser.add_argument("--readme", action="store_true", help="also refresh the README's results block")
    args = parser.parse_args()
    print(write_report(args.profile))
    if args.readme:
        print(update_readme(args.profile))


if __name__ == "__main__":
    main()
