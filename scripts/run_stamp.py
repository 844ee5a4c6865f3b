"""The stamp of an executed notebook: run_all.sh skips a notebook whose stored stamp matches.

``python scripts/run_stamp.py --profile NAME [-p KEY VALUE]... NOTEBOOK...`` prints one line per
notebook, ``<sha256>  <notebook>``; ``--check`` instead compares each with the stored stamp under
results/NAME/executed/ and exits 1, naming them, when any is missing or stale. The stamp hashes
what determines the notebook's results, and nothing else:

- the notebook file's content;
- its papermill parameters (``profile=NAME`` and any ``-p KEY VALUE``);
- the profile's settings, ``load_profile(NAME).as_dict()``;
- the code version: the package's Python code as syntax trees without docstrings (so a comment,
  a docstring or a re-wrapped line is not a change) and the bytes of its data files under
  ``plugin_lib/`` (``.yaml``, ``.csv``, ``.json``, ``.txt``, among them the data checksums);
- the data: which optional data files are present (they change splits), or the Hub.

Before any stamp is printed or checked, every stored run record of the profile is read
(``damaged_records``): a truncated or corrupt one stops the run here, named, with the cheapest
mend first (``git checkout`` for a committed record, else deleting it so that it is recomputed),
instead of letting a matching stamp skip the notebooks that depend on it.

Nothing from the machine, the user or the other environment variables enters it, so a fresh
clone of a commit whose executed notebooks were stamped skips them. The rule that keeps that
true as the code changes: a commit that changes what a stamp hashes re-runs ``run_all.sh
--profile local`` (from the stored runs) and commits results/local with it; the test suite
(``tests/test_committed_results.py``) fails while any committed local stamp is stale.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # this checkout's plugin_lib, whatever PYTHONPATH says
from plugin_lib.harness.profile import load_profile, profile_names, results_dir  # noqa: E402
# The code version is also what every new run record names (plugin_lib/utils/provenance.py).
from plugin_lib.utils.provenance import code_files, code_version, file_content  # noqa: E402,F401

SCHEME = "plugin-repro run stamp v2"


def data_state() -> dict:
    """What of the data can change a notebook's results beyond the checksummed required files
    (data.check stops a run whose files differ from them): the optional files present."""
    from plugin_lib.data import integrity, sources
    from plugin_lib.data.files import data_dir

    try:
        root = data_dir()
    except FileNotFoundError:  # no data folder: run_all.sh's data check stops before any stamp is used
        return {"source": "files", "optional present": []}
    if root is None:
        return {"source": "hub"}
    optional = [d.relpath for d in sources.downloads(integrity.webnlg_files()) if d.optional]
    return {"source": "files", "optional present": [r for r in optional if (root / r).is_file()]}


def stamp(notebook: str | Path, profile: str, parameters: dict[str, str] | None = None,
          code: str | None = None, data: dict | None = None) -> str:
    """The stamp of ``notebook`` run with ``profile`` and the papermill ``parameters``."""
    inputs = {
        "scheme": SCHEME,
        "notebook": hashlib.sha256(file_content(Path(notebook))).hexdigest(),
        "parameters": {"profile": profile, **(parameters or {})},
        "profile": load_profile(profile).as_dict(),
        "code": code or code_version(),
        "data": data or data_state(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode("utf-8")).hexdigest()


def damaged_records(profile: str) -> list[Path]:
    """The stored run records (``runs/**/*.json``, not the temporaries) of ``profile`` that do
    not read as JSON: truncated by a full disk or a copy, or edited by hand."""
    damaged = []
    for path in sorted((results_dir(profile) / "runs").rglob("*.json")):
        if path.name.startswith(".") or "cache" in path.relative_to(results_dir(profile)).parts:
            continue
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            damaged.append(path)
    return damaged


def mend_advice(paths: list[Path]) -> str:
    """What to do about damaged records, the cheapest first: restore the committed ones from git
    (a second), delete the others (their notebook recomputes them)."""
    committed, other = [], []
    for path in paths:
        tracked = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "--error-unmatch", str(path)],
                                 capture_output=True).returncode == 0
        (committed if tracked else other).append(path)
    def shown(paths: list[Path]) -> str:
        return " ".join(str(p.relative_to(REPO_ROOT) if p.is_relative_to(REPO_ROOT) else p) for p in paths)

    lines = []
    if committed:
        lines.append(f"restore the committed record(s) with `git checkout -- {shown(committed)}`")
    if other:
        lines.append(f"delete {shown(other)}: the next run recomputes them")
    return "; ".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", required=True, choices=profile_names())
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                        metavar=("KEY", "VALUE"), help="a papermill parameter passed to the notebook")
    parser.add_argument("--check", action="store_true",
                        help="compare with the stored stamps under results/PROFILE/executed; exit 1 if any is stale")
    parser.add_argument("notebooks", nargs="+")
    args = parser.parse_args(argv)
    damaged = damaged_records(args.profile)
    if damaged:
        print(f"{len(damaged)} stored run record(s) of profile '{args.profile}' cannot be read: "
              f"{', '.join(str(p) for p in damaged)}. The notebooks that use them would be skipped as finished or "
              f"fail late. Mend them first: {mend_advice(damaged)}.", file=sys.stderr)
        return 3
    code, data = code_version(), data_state()
    stale = []
    for notebook in args.notebooks:
        want = stamp(notebook, args.profile, dict(args.parameter), code, data)
        if not args.check:
            print(f"{want}  {notebook}")
            continue
        stored = REPO_ROOT / "results" / args.profile / "executed" / f"{Path(notebook).stem}.done"
        if not stored.is_file() or stored.read_text(encoding="utf-8").strip() != want:
            stale.append(Path(notebook).stem)
    if stale:
        print(f"results/{args.profile} is stale for {len(stale)} notebook(s): {', '.join(stale)}. Their code, "
              f"notebook, profile or data changed since they ran: `bash run_all.sh --profile {args.profile}` "
              "re-runs them (from the stored runs) and the results are committed with the change.",
              file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
