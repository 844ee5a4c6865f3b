"""``plugin-repro data check [--profile NAME] [--only NAME] [--data-dir DIR]`` (or ``python -m
plugin_lib.data.check``): are the datasets there and complete? Exit 0 when they are; 2 with one line per problem otherwise.

It runs, at once and for every file, the checks each loader runs on the files it reads
(``data.integrity``): present, the known SHA-256 (or, without one, the expected row count),
the columns the loaders read. ``run_all.sh`` calls it before any notebook, so a run without
data stops in seconds with what to download, instead of failing (or worse, running on part
of a dataset) later.

Every profile runs notebooks 00-04, which read all four datasets, and notebook 09's word
analyses need NLTK's data, so ``--profile`` (accepted so the call names what it checks for)
does not narrow the check; ``--only`` does.
With ``PLUGIN_DATA_DIR=hub`` the Hub datasets are checked when they load (that needs the
network); here only the Adidas CSV of ``PLUGIN_ADIDAS_CSV`` and NLTK's data are checked.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import integrity, sources
from .files import data_dir, describe_data_dir


def nltk_search_path() -> list[Path]:
    """NLTK's data search path (``nltk.data.path``), without importing nltk (seconds)."""
    folders = [Path(p) for p in os.environ.get("NLTK_DATA", "").split(os.pathsep) if p]
    folders.append(Path.home() / "nltk_data")
    folders += [Path(sys.prefix) / sub for sub in ("nltk_data", "share/nltk_data", "lib/nltk_data")]
    folders += [Path(p) for p in ("/usr/share/nltk_data", "/usr/local/share/nltk_data",
                                  "/usr/lib/nltk_data", "/usr/local/lib/nltk_data")]
    return folders


def _nltk_elsewhere() -> str | None:
    """The folder of NLTK's search path (e.g. NLTK_DATA) with stopwords and punkt_tab, or None."""
    for folder in nltk_search_path():
        stopwords = (folder / "corpora/stopwords").is_dir() or (folder / "corpora/stopwords.zip").is_file()
        punkt_tab = (folder / "tokenizers/punkt_tab/english").is_dir() or (folder / "tokenizers/punkt_tab.zip").is_file()
        if stopwords and punkt_tab:
            return str(folder)
    return None


def check_hub(groups: Sequence[str]) -> tuple[list[integrity.Problem], list[str]]:
    """The local parts of a Hub run: the Adidas CSV and NLTK's data."""
    problems, notes = [], ["the E2E, WebNLG and CommonGen data come from the Hugging Face Hub "
                           "(PLUGIN_DATA_DIR=hub) and are checked when they load"]
    if "adidas" in groups:
        path = os.environ.get("PLUGIN_ADIDAS_CSV")
        if not path:
            problems.append(integrity.Problem("adidas/adidas_usa.csv", (
                "PLUGIN_ADIDAS_CSV is not set: with PLUGIN_DATA_DIR=hub the Adidas CSV is read from the "
                f"path it names. {sources.how_to_get('adidas/adidas_usa.csv')}")))
        else:
            try:
                integrity.verify_file(None, "adidas/adidas_usa.csv", Path(path))
            except (integrity.MissingDataError, integrity.DataError) as err:
                problems.append(integrity.Problem(err.relpath, str(err)))
    if "nltk" in groups and _nltk_elsewhere() is None:
        problems.append(integrity.Problem("nltk_data", (
            "NLTK's stopwords and punkt_tab are not found (NLTK_DATA). "
            f"{sources.how_to_get('nltk_data/corpora/stopwords.zip')}")))
    return problems, notes


def run_check(root: Path | None, groups: Sequence[str]) -> tuple[list[integrity.Problem], list[str]]:
    """(problems, notes) for the data folder ``root`` (None: the Hub)."""
    if root is None:
        return check_hub(groups)
    problems, notes = integrity.check(root, groups)
    nltk_missing = [p for p in problems if p.relpath.startswith("nltk_data/") and not (root / p.relpath).exists()]
    if nltk_missing and len(nltk_missing) == sum(p.relpath.startswith("nltk_data/") for p in problems):
        elsewhere = _nltk_elsewhere()
        if elsewhere is not None:
            problems = [p for p in problems if p not in nltk_missing]
            notes.append(f"NLTK's data is not in the data folder; NLTK finds it at {elsewhere}")
    return problems, notes


def main(argv: Sequence[str] | None = None, profiles: Sequence[str] | None = None) -> int:
    """``profiles``: the names ``--profile`` accepts (the command line above the harness passes
    profiles.yaml's; the data layer does not read the harness's settings)."""
    parser = argparse.ArgumentParser(prog="plugin-repro data check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=profiles, metavar="NAME",
                        help="the profile the data is for (every profile reads every dataset)"
                             + (f": {', '.join(profiles)}" if profiles else ""))
    parser.add_argument("--only", action="append", choices=sources.GROUPS, metavar="NAME",
                        help=f"only this group ({', '.join(sources.GROUPS)}); repeatable")
    parser.add_argument("--data-dir", help="the data folder (default: PLUGIN_DATA_DIR, else the repository's data/)")
    args = parser.parse_args(argv)
    groups = list(args.only or sources.GROUPS)
    try:
        root = Path(args.data_dir).expanduser() if args.data_dir else data_dir()
        if root is not None and not root.is_dir():
            raise FileNotFoundError(f"The data folder {root} does not exist.")
    except FileNotFoundError as err:
        print(f"[data check] FAILED: {err}", file=sys.stderr)
        return 2
    where = str(root) if args.data_dir else describe_data_dir()
    print(f"[data check] {', '.join(groups)}" + (f" for profile '{args.profile}'" if args.profile else "")
          + f" in {where}")
    problems, notes = run_check(root, groups)
    for note in notes:
        print(f"[data check] note: {note}")
    if not problems:
        print("[data check] ok: every file is there and complete.")
        return 0
    print(f"[data check] FAILED: {len(problems)} problem{'s' if len(problems) > 1 else ''} with the data:",
          file=sys.stderr)
    for problem in problems:
        print(f"  - {problem.message}", file=sys.stderr)
    print("[data check] `plugin-repro data fetch` downloads what can be downloaded (Adidas needs a "
          "Kaggle account); data/README.md says where every file comes from.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
