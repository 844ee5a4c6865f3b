"""Copy the confirmation's finished records from its store into this checkout's results/confirm,
to be committed: claims, seed runs, BDPL prompts, diagnostics, tables and figures, and the
selections that finished (a selection record gets its searched "grid" when its search ends). Run
records are final once written; checkpoints (*.pt) and base-output caches stay in the store.
With ``--report``, after the complete ``run_all.sh --profile confirm``, also REPORT.md, TIMES.md
and the executed notebooks: the README links REPORT.md as soon as it is in results/confirm, so a
report of some notebooks only (``--only``) is never copied without it.

The work still under way is kept too, apart from the results, in results/confirm-resume: the
configurations a selection has finished (its record before it gets its "grid") and a BDPL
search's state (``.<prompt>.json.partial``). A store is lost with its machine; what is committed
survives, so ``--restore`` on a new machine lays both into a fresh store and the grid resumes a
search at its next configuration or step instead of its first.

With ``--checkpoints``, the trainings under way are kept too (``.checkpoints/*.pt``, saved every
10 minutes by ``core.train.fit`` and removed by it when the training ends; up to
CHECKPOINT_LIMIT each, a LoRA configuration's is 7.5 MB), so that a configuration that takes
longer than what is left of a session resumes on the next machine from its last save instead of
its first epoch. Each commit of them adds their size to git's history: use it once, at a
session's end.

    python scripts/sync_confirmation.py --store /work/confirm-store             # after runs finish
    python scripts/sync_confirmation.py --store /work/confirm-store --checkpoints   # a session's end
    python scripts/sync_confirmation.py --store /work/confirm-store --restore   # a new machine, first

A committed verdict is final. ``run_all.sh --profile confirm`` judges every claim again, and on
another processor the same runs give statistics that differ in their last digits; the sync never
replaces a committed claim, and puts it back into the store (then re-writes the store's REPORT.md
from it, with ``--report``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's plugin_lib
from plugin_lib.utils.record_manifest import MANIFEST, note_written  # noqa: E402
SKIPPED_FOLDERS = {".locks", "cache", ".checkpoints"}
CHECKPOINT_LIMIT = 32 * 2**20  # bytes: a fine-tuned base's state (hundreds of MB) stays on its machine


def finished(path: Path) -> bool:
    return not path.name.endswith("-selection.json") or "grid" in json.loads(path.read_text(encoding="utf-8"))


def _copy_if_changed(path: Path, destination: Path, *, listed: bool = False) -> bool:
    """Copy ``path`` unless ``destination`` holds the same bytes; ``listed``: a run record's new
    hash goes into the destination store's RECORDS.sha256 (the results, not a resume folder)."""
    if destination.exists() and destination.read_bytes() == path.read_bytes():
        return False
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, destination)
    if listed:
        note_written(destination)
    return True


def _records(store: Path, pattern: str) -> list[Path]:
    return [p for p in store.rglob(pattern) if not SKIPPED_FOLDERS & set(p.relative_to(store).parts)]


def keep_committed_claims(store: Path, target: Path) -> list[str]:
    """Put every claim committed in ``target`` back into ``store`` where the store's copy differs
    (judged again after it was committed); returns their names."""
    kept = []
    for committed in sorted((target / "claims").glob("*.json")):
        judged_again = store / "claims" / committed.name
        if judged_again.is_file() and judged_again.read_bytes() != committed.read_bytes():
            shutil.copy2(committed, judged_again)
            kept.append(committed.stem)
    return kept


def sync(store: Path, target: Path, report: bool = False) -> tuple[int, int]:
    """(files copied or updated, unfinished selections removed from ``target``)."""
    copied = removed = 0
    sources = _records(store, "*.json")
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
        copied += _copy_if_changed(path, destination, listed=True)
    return copied, removed


def _finished_elsewhere(kept: Path, store: Path, resume: Path) -> bool:
    """Whether a kept search state is over: its selection finished, its BDPL prompt is recorded,
    or its training's checkpoint is gone from the store (the training ended)."""
    relative = kept.relative_to(resume)
    if ".checkpoints" in relative.parts:
        return not (store / relative).is_file()
    if kept.name.endswith(".json.partial"):
        record = store / relative.with_name(kept.name[1:-len(".partial")])
        return record.is_file() and not (store / relative).exists()
    current = store / relative
    return current.is_file() and finished(current)


def training_checkpoints(store: Path) -> tuple[list[Path], list[Path]]:
    """The store's trainings under way (``.checkpoints/*.pt``): those up to CHECKPOINT_LIMIT, and
    the larger ones, which are not kept."""
    found = sorted(store.glob("runs/**/.checkpoints/*.pt"))
    return ([p for p in found if p.stat().st_size <= CHECKPOINT_LIMIT],
            [p for p in found if p.stat().st_size > CHECKPOINT_LIMIT])


def save_resume_state(store: Path, resume: Path, checkpoints: bool = False) -> tuple[int, int]:
    """Copy the store's searches under way (with ``checkpoints``, its trainings under way too)
    into ``resume``; drop the states of searches and trainings that have ended since. Returns
    (states copied or updated, states dropped)."""
    saved = dropped = 0
    searching = [p for p in _records(store, "*-selection.json") if not finished(p)]
    training = training_checkpoints(store)[0] if checkpoints else []
    for path in searching + _records(store, ".*.json.partial") + training:  # a BDPL checkpoint is always under way
        saved += _copy_if_changed(path, resume / path.relative_to(store))
    for kept in [p for p in resume.rglob("*") if p.is_file()]:
        if _finished_elsewhere(kept, store, resume):
            kept.unlink()
            dropped += 1
    return saved, dropped


def restore(target: Path, resume: Path, store: Path) -> int:
    """Lay the committed records, then the kept search states, into ``store`` wherever it has no
    file of that name (a store's own file is as new as the committed one, or newer). Returns the
    files laid."""
    laid = 0
    for source in (target, resume):
        for path in [p for p in source.rglob("*") if p.is_file() and p.name != MANIFEST]:
            destination = store / path.relative_to(source)
            if not destination.exists():
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, destination)
                note_written(destination)  # the store lists what it was given, as what it writes
                laid += 1
    return laid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="the PLUGIN_RESULTS_DIR the runs write to")
    parser.add_argument("--profile", default="confirm")
    parser.add_argument("--report", action="store_true",
                        help="also REPORT.md, TIMES.md and the executed notebooks (after a complete run_all.sh)")
    parser.add_argument("--checkpoints", action="store_true",
                        help="also the trainings under way (.checkpoints/*.pt), for the next machine to resume "
                             "mid-training; each commit of them grows git's history by their size: at a session's end")
    parser.add_argument("--restore", action="store_true",
                        help="the other way: lay the committed records and kept search states into the store "
                             "(a new machine), and link its local claims to this checkout's")
    args = parser.parse_args()
    store = args.store / args.profile
    target, resume = ROOT / "results" / args.profile, ROOT / "results" / f"{args.profile}-resume"
    if args.restore:
        laid = restore(target, resume, store)
        # each verdict quotes the paper's number from the exploratory claim of the same key
        claims = args.store / "local" / "claims"
        if not claims.exists():
            claims.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(ROOT / "results" / "local" / "claims", claims)
        print(f"{laid} files laid into {store} from results/{args.profile} and results/{args.profile}-resume")
        return
    if not store.is_dir():
        raise SystemExit(f"sync_confirmation.py: no {args.profile} results under {args.store}; pass the "
                         "PLUGIN_RESULTS_DIR the grid wrote to.")
    kept = keep_committed_claims(store, target)
    if kept:
        print(f"judged again since committed, kept as committed (a judged claim is final): {', '.join(kept)}")
        if args.report:  # the store's report was written from the claims judged again
            subprocess.run([sys.executable, "-m", "plugin_lib", "report", "--profile", args.profile], check=True,
                           cwd=ROOT, env={**os.environ, "PLUGIN_RESULTS_DIR": str(args.store)})
    copied, removed = sync(store, target, report=args.report)
    saved, dropped = save_resume_state(store, resume, checkpoints=args.checkpoints)
    if args.checkpoints:
        for path in training_checkpoints(store)[1]:
            print(f"not kept (over {CHECKPOINT_LIMIT / 2**20:.0f} MiB; it resumes only on this machine): "
                  f"{path.relative_to(store)} ({path.stat().st_size / 2**20:,.0f} MiB)")
    print(f"{copied} records copied or updated, {removed} unfinished selections removed, in results/{args.profile}; "
          f"{saved} search states kept and {dropped} ended ones dropped, in results/{args.profile}-resume")


if __name__ == "__main__":
    main()
