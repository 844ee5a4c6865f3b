"""Which code made each folder of runs: the report's "Code versions" section (issue 45).

A run record written since provenance was recorded (``utils.provenance``) names its commit, its
code version and a hash of every method module. For those, each folder of runs (one dataset
and base: the runs of one table's rows) lists its commits and code versions, and is flagged
when its runs differ in a method module (the modules are named). An older record names no code.
For it, this section says only what git can prove: the commit that first added the file
("committed in", never "produced by"). That commit is an upper bound on the code's age, not
its version.
"""
from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path

from ..harness.profile import REPO_ROOT
from ..utils.provenance import FORMER_METHOD_MODULES, METHOD_MODULES


def _provenances(record: dict) -> list[dict]:
    """The provenance entries of one record: its own, or each configuration's (a selection)."""
    if isinstance(record.get("provenance"), dict):
        return [record["provenance"]]
    configs = record.get("configs")
    if isinstance(configs, dict):
        return [c["provenance"] for c in configs.values() if isinstance(c, dict) and isinstance(c.get("provenance"), dict)]
    return []


def _git(repo: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _committed_in(paths: list[Path], repo: Path) -> dict[Path, tuple[int, str]] | None:
    """For each path, the commit that first added it to git, as (age rank: 0 the newest, short
    hash and date); None without git history."""
    folders = sorted({str(p.resolve().parent.relative_to(repo.resolve())) for p in paths})
    # %H cut to 7, not %h: git lengthens %h as a repository grows, and the report must not change
    out = _git(repo, "log", "--diff-filter=A", "--format=@%H %cs", "--name-only", "--", *folders)
    if out is None:
        return None
    added, commit, rank = {}, None, -1
    for line in out.splitlines():
        if line.startswith("@"):
            full_hash, date = line[1:].split(" ", 1)
            commit, rank = f"{full_hash[:7]} {date}", rank + 1
        elif line.strip():
            added[(repo / line.strip()).resolve()] = (rank, commit)  # newest first: the last seen is the first add
    return {p: added.get(p.resolve(), (-1, "not in git")) for p in paths}


def _changed_between(oldest: str, newest: str, repo: Path) -> list[str]:
    """The method modules that some commit after ``oldest`` up to ``newest`` changed (git)."""
    out = _git(repo, "log", "--format=", "--name-only", f"{oldest}..{newest}", "--", *METHOD_MODULES,
               *FORMER_METHOD_MODULES)
    return sorted({line.strip() for line in (out or "").splitlines() if line.strip().endswith(".py")})


def folder_versions(runs: Path, repo: Path = REPO_ROOT) -> list[dict]:
    """One entry per folder of run records under ``runs``: its records, the commits, code
    versions and differing method modules of those with provenance, and the git commits that
    added those without."""
    folders: dict[Path, list[Path]] = defaultdict(list)
    for path in sorted(runs.rglob("*.json")):
        folders[path.parent].append(path)
    legacy_paths, entries = [], []
    for folder, paths in sorted(folders.items()):
        stamped, legacy = [], []
        for path in paths:
            try:
                found = _provenances(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue  # not a run record (the store reports corrupt ones itself)
            (stamped.extend(found) if found else legacy.append(path))
        modules = defaultdict(set)
        for p in stamped:
            for name, digest in (p.get("modules") or {}).items():
                modules[name].add(digest)
        commits = {f"{g['commit'][:7]}{' (dirty)' if g.get('dirty') else ''}" for p in stamped if (g := p.get("git"))}
        entries.append({"folder": folder.relative_to(runs).as_posix(), "records": len(paths), "legacy": legacy,
                        "commits": sorted(commits), "codes": sorted({p["code"][:10] for p in stamped if p.get("code")}),
                        "differing": sorted(name for name, digests in modules.items() if len(digests) > 1)})
        legacy_paths += legacy
    added = _committed_in(legacy_paths, repo) if legacy_paths else {}
    for entry in entries:
        legacy = entry.pop("legacy")
        entry["committed_in"], entry["changed_between"] = [], []
        if not legacy:
            continue
        if added is None:
            entry["committed_in"] = ["no git history"]
            continue
        found = sorted({added[p] for p in legacy}, reverse=True)  # oldest first
        entry["committed_in"] = [commit for _, commit in found]
        known = [commit.split()[0] for rank, commit in found if rank >= 0]
        if len(known) > 1:
            entry["changed_between"] = _changed_between(known[0], known[-1], repo)
    return entries


def code_versions_section(root: Path, repo: Path = REPO_ROOT) -> list[str]:
    """The report's section: per folder of runs, the code that made them (module docstring)."""
    runs = root / "runs"
    if not runs.is_dir():
        return []
    entries = folder_versions(runs, repo)
    if not entries:
        return []
    lines = ["## Code versions", "",
             "Per folder of runs (one dataset and base). Runs that record their provenance give the commits and "
             "code versions that made them, flagged where they differ in a method module. Older runs name no code: "
             "for them git proves only the commits that first added their files (*committed in*: the code that made "
             "a run is no newer than that commit, and nothing more is claimed), and which method modules changed "
             "between the first and the last of those commits (the runs may straddle those changes).", "",
             "| runs | records | made by (commit; code version) | committed in (git, older records) | method modules "
             "that differ, or changed between those commits |", "| --- | --- | --- | --- | --- |"]
    for e in entries:
        made = "; ".join([", ".join(e["commits"]), ", ".join(e["codes"])]) if e["commits"] or e["codes"] else "-"
        differ = ("**differs: " + ", ".join(m.removeprefix("plugin_lib/") for m in e["differing"]) + "**"
                  if e["differing"] else "")
        changed = (f"changed between: {', '.join(m.removeprefix('plugin_lib/') for m in e['changed_between'])}"
                   if e["changed_between"] else "")
        lines.append(f"| {e['folder']} | {e['records']} | {made} | {_commits(e['committed_in'])} | "
                     f"{'; '.join(x for x in (differ, changed) if x) or '-'} |")
    return lines + [""]


def _commits(commits: list[str]) -> str:
    """A list of (hash date) commits, oldest first, shortened to its ends when long."""
    if len(commits) <= 3:
        return ", ".join(commits) or "-"
    return f"{len(commits)} commits: {commits[0]} ... {commits[-1]}"
