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
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # this checkout's plugin_lib, whatever PYTHONPATH says
from plugin_lib.harness.profile import load_profile, profile_names  # noqa: E402
# The code version is also what every new run record names (plugin_lib/utils/provenance.py).
from plugin_lib.utils.provenance import code_files, code_version, file_content  # noqa: E402,F401

SCHEME = "plugin-repro run stamp v2"


def data_state() -> dict:
    """What of the data can change a notebook's results beyond the checksummed required files
    (data.check stops a run whose files differ from them): the optional files present."""
    from plugin_lib.data import integrity, sources
    from plugin_lib.data.datasets import data_dir

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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", required=True, choices=profile_names())
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                        metavar=("KEY", "VALUE"), help="a papermill parameter passed to the notebook")
    parser.add_argument("--check", action="store_true",
                        help="compare with the stored stamps under results/PROFILE/executed; exit 1 if any is stale")
    parser.add_argument("notebooks", nargs="+")
    args = parser.parse_args(argv)
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
