"""The stamp of an executed notebook: ``plugin-repro run`` skips a notebook whose stored stamp matches.

``plugin-repro stamp --profile NAME [-p KEY VALUE]... NOTEBOOK...`` prints one line per
notebook (a file, a name or its start: ``15``), ``<sha256>  <notebook>``; ``--check`` instead
compares each (every notebook when none is named) with the stored stamp under
results/NAME/executed/ (PLUGIN_RESULTS_DIR's, where it is set, as ``run`` writes them) and exits 1,
naming them, when any is missing or stale. The stamp hashes
what determines the notebook's results, and nothing else:

- the notebook file's content;
- its papermill parameters (``profile=NAME`` and any ``-p KEY VALUE``);
- the profile's settings, ``load_profile(NAME).as_dict()``;
- the code version: the package's Python code as syntax trees without docstrings (so a comment,
  a docstring or a re-wrapped line is not a change) and the bytes of its data files under
  ``plugin_lib/`` (``.yaml``, ``.csv``, ``.json``, ``.txt``, among them the data checksums);
- the data: which optional data files are present (they change splits), or the Hub.

Before any stamp is printed or checked, every stored run record of the profile is checked, so
that a matching stamp never skips (and ``--force`` never re-aggregates) a notebook over a bad
record. Each fault stops here with one line naming the files and the cheapest mend first
(``git checkout`` for a committed record, else deleting it so that it is recomputed):

- a record that does not read as JSON (truncated by a full disk or a copy): ``damaged_records``;
- a record whose content differs from the hash the store wrote for it in the store's manifest,
  ``RECORDS.sha256`` (``plugin_lib/utils/record_manifest.py``): a number edited by hand;
- a record whose metrics its own predictions do not give (``harness/running/record_scores.py``: each
  record is scored again from its predictions and its inputs' references, once per machine): an
  edit that also rewrote the record's manifest line, or a record scored by older scorers;
- a record the manifest does not list: the store lists each record as it writes it, so the store
  did not write it (or its writer stopped in between). ``--write-manifest`` lists such records
  once you know where they came from (and makes the manifest of a store that has none).

Exit status: 0 fine, 1 a stamp is stale (``--check``), 2 bad arguments, 4 a damaged (unreadable)
record, 5 an edited record (or one whose metrics its predictions do not give), 6 a record not in
the manifest (the lowest applies when several do).
``plugin-repro run`` passes them on; its 3 is another run holding the profile.

Nothing from the machine, the user or the other environment variables enters it, so a fresh
clone of a commit whose executed notebooks were stamped skips them. The rule that keeps that
true as the code changes: a commit that changes what a stamp hashes re-runs ``run_all.sh
--profile local`` (from the stored runs) and commits results/local with it; the test suite
(``tests/test_committed_results.py``) fails while any committed local stamp is stale.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from ..harness.machine import results_dir
from ..harness.profile import REPO_ROOT, ProfileError, load_profile, profile_names
from ..utils import record_manifest
# The code version is also what every new run record names (plugin_lib/utils/provenance.py).
from ..utils.provenance import code_version, file_content

DAMAGED, EDITED, UNLISTED = 4, 5, 6  # exit statuses (3 is run_all.sh's: another run holds the profile)

SCHEME = "plugin-repro run stamp v2"


def data_state() -> dict:
    """What of the data can change a notebook's results beyond the checksummed required files
    (data.check stops a run whose files differ from them): the optional files present."""
    from ..data import integrity, sources
    from ..data.files import data_dir

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


def profile_records(profile: str) -> list[Path]:
    """The stored run records of ``profile``, in each of its stores (``record_manifest.stores``)."""
    return [store / name for store in record_manifest.stores(results_dir(profile))
            for name in record_manifest.records(store)]


def damaged_records(profile: str) -> list[Path]:
    """The stored run records (``runs/**/*.json``, not the temporaries) of ``profile`` that do
    not read as JSON: truncated by a full disk or a copy, or broken by an edit."""
    damaged = []
    for path in profile_records(profile):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            damaged.append(path)
    return damaged


def changed_records(profile: str) -> tuple[list[Path], list[Path]]:
    """(edited, unlisted) records of ``profile``'s stores that have a manifest
    (``record_manifest.verify``); ManifestError for a manifest that cannot be read."""
    edited, unlisted = [], []
    for store in record_manifest.stores(results_dir(profile)):
        found = record_manifest.verify(store)
        if found is not None:
            edited += [store / name for name in found[0]]
            unlisted += [store / name for name in found[1]]
    return edited, unlisted


def shown(paths: list[Path], sep: str = " ") -> str:
    """Paths as a user types them here: relative to the checkout where inside it."""
    return sep.join(str(p.relative_to(REPO_ROOT) if p.is_relative_to(REPO_ROOT) else p) for p in paths)


def _committed_content(path: Path) -> bytes | None:
    """The content of ``path`` at HEAD, or None where it is not a committed file of this checkout."""
    try:
        relative = path.resolve().relative_to(REPO_ROOT)
    except ValueError:
        return None
    done = subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"HEAD:{relative.as_posix()}"], capture_output=True)
    return done.stdout if done.returncode == 0 else None


def mend_advice(paths: list[Path], listed: bool = False) -> str:
    """What to do about bad records, the cheapest first: restore the committed ones from git
    (a second), delete the others (their notebook recomputes them). With ``listed``, a committed
    record counts only where git's copy has the hash its manifest lists (the store may have
    rewritten it since the commit; then git's copy would be refused too)."""
    committed, other = [], []
    for path in paths:
        content = _committed_content(path)
        if content is not None and listed:
            found = record_manifest.store_of(path)
            want = (record_manifest.read_manifest(found[0]) or {}).get(found[1]) if found else None
            if record_manifest.digest(content) != want:
                content = None
        (committed if content is not None else other).append(path)
    lines = []
    if committed:
        lines.append(f"restore the committed record(s) with `git checkout -- {shown(committed)}`")
    if other:
        lines.append(f"delete {shown(other)}: the next run recomputes them")
    return "; ".join(lines)


def content_mismatches(paths: list[Path]) -> list:
    """``harness.running.record_scores.mismatches`` of ``paths``, named as a user types them; none
    (said in one line) where the data is absent: the run's data check stops first then."""
    from ..data import DataError
    from ..harness.running import record_scores

    try:
        found = record_scores.mismatches(paths, say=lambda line: print(line, file=sys.stderr))
    except (DataError, FileNotFoundError) as err:
        print(f"The stored records' metrics were not checked against their predictions: {str(err).splitlines()[0]}",
              file=sys.stderr)
        return []
    return [dataclasses.replace(m, path=Path(shown([m.path]))) for m in found]


def content_mend_advice(paths: list[Path]) -> str:
    """Committed records whose committed copy differs from the file: restore them and their
    manifest from git; any other (a record committed or stored as it is): delete it, so that the
    next run recomputes it."""
    restorable, other = [], []
    for path in paths:
        path = REPO_ROOT / path if not path.is_absolute() else path
        content = _committed_content(path)
        changed = content is not None and record_manifest.digest(content) != record_manifest.content_hash(path)
        (restorable if changed else other).append(path)
    lines = []
    if restorable:
        manifests = sorted({record_manifest.manifest_path(record_manifest.store_of(p)[0]) for p in restorable})
        lines.append(f"restore the committed record(s) and manifest with `git checkout -- {shown(restorable + manifests)}`")
    if other:
        lines.append(f"delete {shown(other)}: the next run recomputes them")
    return "; ".join(lines)


def check_records(profile: str, adopting: bool = False) -> int:
    """Every stored record of ``profile`` checked (module docstring): one line on stderr per
    kind of fault, and the lowest exit status among them (0: all fine). ``adopting``: records
    not in the manifest are about to be listed, so they are not a fault."""
    faults = []
    damaged = damaged_records(profile)
    if damaged:
        faults.append((DAMAGED, f"{len(damaged)} stored run record(s) of profile '{profile}' cannot be read: "
                       f"{shown(damaged, ', ')}. The notebooks that use them would be skipped as finished "
                       f"or fail late. Mend them first: {mend_advice(damaged)}."))
    try:
        edited, unlisted = changed_records(profile)
    except record_manifest.ManifestError as err:  # a manifest it cannot read is a damaged file too
        faults.append((DAMAGED, str(err)))
        edited, unlisted = [], []
    edited = [p for p in edited if p not in damaged]
    if edited:
        faults.append((EDITED, f"{len(edited)} stored run record(s) of profile '{profile}' differ from the hash the "
                       f"store wrote for them in {record_manifest.MANIFEST}: {shown(edited, ', ')}. They "
                       "were changed after they were stored (an edited number is still valid JSON), and a notebook "
                       f"would report the change as a result. Mend them first: {mend_advice(edited, listed=True)}."))
    wrong = content_mismatches([p for p in profile_records(profile) if p not in damaged + edited])
    if wrong:
        faults.append((EDITED, f"{len({m.path for m in wrong})} stored run record(s) of profile '{profile}' hold metrics "
                       f"that their own predictions do not give: {'; '.join(m.line() for m in wrong[:4])}"
                       f"{f'; and {len(wrong) - 4} more' if len(wrong) > 4 else ''}. A notebook would report them as "
                       f"results. Mend them first: {content_mend_advice(sorted({m.path for m in wrong}))}."))
    unlisted = [p for p in unlisted if p not in damaged]
    if unlisted and not adopting:
        faults.append((UNLISTED, f"{len(unlisted)} run record(s) of profile '{profile}' are not in their store's "
                       f"{record_manifest.MANIFEST}, so the store did not write them (copied in, written by hand or "
                       f"by an older checkout, or their writer was stopped before listing them): "
                       f"{shown(unlisted, ', ')}. Delete them: the next run recomputes them; or, once you "
                       f"know they are the store's, list them with `plugin-repro stamp --profile {profile} "
                       "--write-manifest`."))
    for _, line in faults:
        print(line, file=sys.stderr)
    return min((status for status, _ in faults), default=0)


def notebook_files(names: list[str]) -> list[str]:
    """Each of ``names`` as a notebook file: a file as it is, else the registry's notebooks whose
    names start with it (``studies.chosen``); every notebook where ``names`` is empty."""
    from . import studies

    def _registry_file(notebook: str) -> str:  # relative where this is the checkout's root (as printed)
        path = studies.NOTEBOOKS_DIR / f"{notebook}.ipynb"
        return str(path.relative_to(REPO_ROOT)) if Path.cwd() == REPO_ROOT else str(path)

    if not names:
        return [_registry_file(notebook) for notebook in studies.NOTEBOOKS]
    files = []
    for name in names:
        if Path(name).is_file():
            files.append(name)
            continue
        try:
            found = studies.chosen([Path(name).stem])
        except ValueError:
            raise ValueError(f"{name} is neither a notebook file nor the start of a notebook's name; the "
                             f"notebooks: {', '.join(studies.NOTEBOOKS)}.") from None
        files += [_registry_file(study.notebook) for study in found]
    return files


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="plugin-repro stamp", description=__doc__.split("\n")[0],
                                     epilog="Exit status: 0 fine, 1 stale (--check), 2 bad arguments, 4 a damaged "
                                            "record, 5 an edited record or metrics its predictions do not give, 6 a record not in "
                                            "the manifest.")
    parser.add_argument("--profile", required=True, choices=profile_names())
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                        metavar=("KEY", "VALUE"), help="a papermill parameter passed to the notebook")
    parser.add_argument("--check", action="store_true",
                        help="compare with the stored stamps under results/PROFILE/executed (PLUGIN_RESULTS_DIR's where "
                             "set); exit 1 if any is missing or stale")
    parser.add_argument("--write-manifest", action="store_true",
                        help=f"list the stored records its {record_manifest.MANIFEST} lacks (after checking the "
                             "listed ones) and drop the entries of absent ones")
    parser.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                        help="a notebook's file, name or prefix (15, 15_proxy_tuning); with --check, all by default")
    args = parser.parse_args(argv)
    if not args.notebooks and args.check:
        args.notebooks = notebook_files([])
    elif not args.notebooks and not args.write_manifest:
        parser.error("name at least one notebook (or --check, or --write-manifest)")
    else:
        try:  # before the records' check, which takes a minute
            args.notebooks = notebook_files(args.notebooks)
        except ValueError as err:
            parser.error(str(err))
    status = check_records(args.profile, adopting=args.write_manifest)
    if status:
        return status
    if args.write_manifest:
        for store in record_manifest.stores(results_dir(args.profile)):
            added = record_manifest.adopt(store)
            print(f"{len(added)} record(s) newly listed in {record_manifest.manifest_path(store)}", file=sys.stderr)
        if not args.notebooks:
            return 0
    code, data = code_version(), data_state()
    executed = results_dir(args.profile) / "executed"  # where run_all.sh stamps them, PLUGIN_RESULTS_DIR's too
    stale, unrun = [], []
    for notebook in args.notebooks:
        want = stamp(notebook, args.profile, dict(args.parameter), code, data)
        if not args.check:
            print(f"{want}  {notebook}")
            continue
        stored = executed / f"{Path(notebook).stem}.done"
        if not stored.is_file():
            unrun.append(Path(notebook).stem)
        elif stored.read_text(encoding="utf-8").strip() != want:
            stale.append(Path(notebook).stem)
    folder = shown([executed.parent])
    rerun = f"`bash run_all.sh --profile {args.profile}` runs them (from the stored runs, where they are)"
    if stale:
        print(f"{folder} is stale for {len(stale)} notebook(s): {', '.join(stale)}. Their code, notebook, profile or "
              f"data changed since they ran: {rerun}"
              f"{'; results/local is committed with the change' if args.profile == 'local' else ''}.", file=sys.stderr)
    if unrun:
        print(f"{folder} holds no execution of {len(unrun)} notebook(s): {', '.join(unrun)}. {rerun}.",
              file=sys.stderr)
    return 1 if stale or unrun else 0


def main_or_profile_error(argv: list[str]) -> int:
    try:
        return main(argv)
    except ProfileError as err:
        print(f"plugin-repro stamp: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main_or_profile_error(sys.argv[1:]))
