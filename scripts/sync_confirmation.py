"""Copy the confirmation's finished records from its store into this checkout's results/confirm,
to be committed: claims, seed runs, BDPL prompts, diagnostics, tables and figures, and the
selections that finished (a selection record gets its searched "grid" when its search ends). Run
records are final once written; checkpoints (*.pt) and base-output caches stay in the store.
With ``--report``, after the complete ``run_all.sh --profile confirm``, also REPORT.md, TIMES.md
and the executed notebooks: the README links REPORT.md as soon as it is in results/confirm, so a
report of some notebooks only (``--only``) is never copied without it.

    python scripts/sync_confirmation.py --store /work/confirm-store   # the PLUGIN_RESULTS_DIR of the runs
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_FOLDERS = {".locks", "cache"}


def finished(path: Path) -> bool:
    return not path.name.endswith("-selection.json") or "grid" in json.loads(path.read_text(encoding="utf-8"))


def sync(store: Path, target: Path, report: bool = False) -> tuple[int, int]:
    """(files copied or updated, unfinished selections removed from ``target``)."""
    copied = removed = 0
    sources = [p for p in store.rglob("*.json") if not SKIPPED_FOLDERS & set(p.relative_to(store).parts)]
    sources += [p for folder in ("tables", "figures") for p in (store / folder).glob("*") if p.is_file()]
    if report:
        sources += [p for p in (store / "REPORT.md", store / "TIMES.md") if p.is_file()]
        sources += [p for p in (store / "executed").glob("*") if p.is_file()]
    for path in sources:
        destination = target / path.relative_to(store)
        if not finished(path):
            if destination.exists():
                destination.unlink()
                removed += 1
            continue
        if not destination.exists() or destination.read_bytes() != path.read_bytes():
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)
            copied += 1
    return copied, removed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="the PLUGIN_RESULTS_DIR the runs write to")
    parser.add_argument("--profile", default="confirm")
    parser.add_argument("--report", action="store_true",
                        help="also REPORT.md, TIMES.md and the executed notebooks (after a complete run_all.sh)")
    args = parser.parse_args()
    store = args.store / args.profile
    if not store.is_dir():
        raise SystemExit(f"sync_confirmation.py: no {args.profile} results under {args.store}; pass the "
                         "PLUGIN_RESULTS_DIR the grid wrote to.")
    copied, removed = sync(store, ROOT / "results" / args.profile, report=args.report)
    print(f"{copied} records copied or updated, {removed} unfinished selections removed, in results/{args.profile}")


if __name__ == "__main__":
    main()
