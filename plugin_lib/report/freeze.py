"""Which commit froze the preregistered rules, and the check that git history bears it out.

``FROZEN_AT`` is the commit that added the rules (``report.preregistered``), the frozen test
inputs and the ``confirm`` profile; it is written in the commit after it (a commit cannot name
itself). :func:`check` lists every way the history contradicts the preregistration:

- a frozen file, or the ``confirm`` profile (with the models and reweighting architectures it
  uses), differs from that commit;
- a confirmatory result (a file under ``results/confirm`` now) entered git, at any time, in a
  commit that does not descend from it, or in it;
- while ``FROZEN_AT`` is unset, any confirmatory result is in git at all.

The second wave (``report.preregistered_wave2``, issue 45) was frozen later, in a commit of its
own, ``WAVE2_FROZEN_AT``. :func:`check_wave2` lists the contradictions of its history: its rules
file differs from that commit, or one of its results (``WAVE2_RESULTS``: its claims, and the
runs of BDPL, LoRA and the deeper models on WebNLG, CommonGen and Adidas) entered git in that
commit or in one that does not descend from it.

The third wave (``report.preregistered_wave3``, issue 60) has a profile of its own, ``wave3``,
frozen with its rules and inputs in ``WAVE3_FROZEN_AT``; :func:`check_wave3` lists the
contradictions of its history, and every file under ``results/wave3`` is one of its results.
The fourth (``report.preregistered_wave4``, issue 73) is checked the same way, with its profile
``wave4``, ``WAVE4_FROZEN_AT`` and ``results/wave4`` (:func:`check_wave4`).

``tests/test_preregistration*.py`` run the checks on the repository; the report quotes the commits.
"""
from __future__ import annotations

import fnmatch
import subprocess
from collections.abc import Sequence
from pathlib import Path

import yaml

from ..harness.profile import PROFILES_FILE, REPO_ROOT

FROZEN_FILES = ("plugin_lib/report/preregistered.py", "plugin_lib/report/preregistered_inputs.json")
FROZEN_PROFILE = "confirm"
CONFIRM_RESULTS = "results/confirm"
FROZEN_AT: str | None = "f13c0acf11332f46735cab4a4512b286554e2344"  # the commit "Preregistration (issue 25): ..."


WAVE2_FILES = ("plugin_lib/report/preregistered_wave2.py",)
WAVE2_FROZEN_AT = "64d4a179c75dd991719a37d0572d71fba985a653"  # the commit "Wave 2 preregistered (issue 45): ..."
WAVE2_RESULTS = (
    f"{CONFIRM_RESULTS}/claims/wave2_*",
    *(f"{CONFIRM_RESULTS}/runs/{dataset}/*/{name}"
      for dataset in ("webnlg", "commongen", "adidas")
      for name in ("BDPL*", "LoRA*", "Plugin-*L-*", "bdpl-prompts/*")),
)

WAVE3_FILES = ("plugin_lib/report/preregistered_wave3.py", "plugin_lib/report/preregistered_wave3_inputs.json")
WAVE3_FROZEN_AT = "901843a2cc662a66eb8d1449428d265ce430aae4"  # the commit "Wave 3 preregistered (issue 60): ..."
WAVE3_PROFILE = "wave3"
WAVE3_RESULTS = "results/wave3"  # everything under it

WAVE4_FILES = ("plugin_lib/report/preregistered_wave4.py", "plugin_lib/report/preregistered_wave4_inputs.json")
WAVE4_FROZEN_AT = "690db6c2b857bcbe7fb7325807c7c09fc394ffa5"  # the commit "Wave 4 preregistered (issue 73): ..."
WAVE4_PROFILE = "wave4"
WAVE4_RESULTS = "results/wave4"  # everything under it


class HistoryUnavailable(RuntimeError):
    """No git history to check (not a git checkout, git missing, or a shallow clone)."""


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=check)
    except FileNotFoundError as err:
        raise HistoryUnavailable("git is not installed") from err


def frozen_settings(profiles_text: str, name: str = FROZEN_PROFILE) -> dict:
    """The profile ``name`` of a profiles.yaml text, with the model entries and the reweighting
    architectures it uses: everything the confirmation's runs read from that file."""
    settings = yaml.safe_load(profiles_text)
    profile = settings["profiles"].get(name)
    if profile is None:
        return {}
    names = set(profile["base_models"]) | {profile["ablations"]["model"], profile["api"]["model"],
                                           profile["api"]["compare"]}
    names |= {profile["shift"]["model"]} - {None}
    models = {n: settings["models"][n] for n in sorted(names)}
    families = {m["family"] for m in models.values()}
    return {"profile": profile, "models": models,
            "reweighters": {f: settings["reweighters"][f] for f in sorted(families)}}


def check(repo: Path = REPO_ROOT, frozen_at: str | None = FROZEN_AT, files: Sequence[str] = FROZEN_FILES,
          results: str = CONFIRM_RESULTS, profiles: str | None = None) -> list[str]:
    """Every contradiction between the history of ``repo`` and the preregistration (empty: none).
    Raises ``HistoryUnavailable`` when there is no history to read."""
    repo = Path(repo)
    if _git(repo, "rev-parse", "--git-dir", check=False).returncode != 0:
        raise HistoryUnavailable(f"{repo} is not a git checkout")
    if _git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        raise HistoryUnavailable(f"{repo} is a shallow clone: fetch its history (git fetch --unshallow)")
    tracked = {line for line in _git(repo, "ls-files", "--", results).stdout.splitlines() if line}
    if frozen_at is None:
        return [f"{len(tracked)} confirmatory result file(s) are in git, but no commit froze the rules: "
                f"{sorted(tracked)[:3]}"] if tracked else []
    if _git(repo, "cat-file", "-e", f"{frozen_at}^{{commit}}", check=False).returncode != 0:
        raise HistoryUnavailable(f"the freezing commit {frozen_at} is not in this clone's history")
    problems = []
    changed = [f for f in files if _git(repo, "diff", "--quiet", frozen_at, "--", f, check=False).returncode != 0]
    problems += [f"{f} differs from the freezing commit {frozen_at[:10]}" for f in changed]
    profiles_path = profiles or str(PROFILES_FILE.relative_to(REPO_ROOT))
    then = _git(repo, "show", f"{frozen_at}:{profiles_path}", check=False)
    now = (repo / profiles_path).read_text(encoding="utf-8") if (repo / profiles_path).exists() else ""
    if then.returncode != 0 or frozen_settings(then.stdout) != frozen_settings(now) or not frozen_settings(now):
        problems.append(f"the {FROZEN_PROFILE!r} profile (or a model or architecture it uses) in {profiles_path} "
                        f"differs from the freezing commit {frozen_at[:10]}")
    return problems + _added_before(repo, frozen_at, results, tracked)


def _added_before(repo: Path, frozen_at: str, results: str, tracked: set[str]) -> list[str]:
    """Each of the ``tracked`` files under ``results`` whose adding commit is ``frozen_at`` or
    does not descend from it."""
    added = _git(repo, "log", "--format=commit %H", "--name-only", "--diff-filter=A", "--", results).stdout
    commit, problems = None, []
    for line in added.splitlines():
        if line.startswith("commit "):
            commit = line.split()[1]
        elif line.strip() in tracked:
            after = commit != frozen_at and _git(repo, "merge-base", "--is-ancestor", frozen_at, commit,
                                                 check=False).returncode == 0
            if not after:
                problems.append(f"{line} entered git in {commit[:10]}, which does not come after the freezing "
                                f"commit {frozen_at[:10]}")
    return problems


def check_wave2(repo: Path = REPO_ROOT, frozen_at: str = WAVE2_FROZEN_AT, files: Sequence[str] = WAVE2_FILES,
                patterns: Sequence[str] = WAVE2_RESULTS, results: str = CONFIRM_RESULTS) -> list[str]:
    """Every contradiction between the history of ``repo`` and the second wave's freeze (empty:
    none). Wave 1's own check (:func:`check`) covers the ``confirm`` profile and the tests it reuses."""
    return _check_wave(repo, "wave-2", frozen_at, files, patterns, results)


def check_wave3(repo: Path = REPO_ROOT, frozen_at: str = WAVE3_FROZEN_AT, files: Sequence[str] = WAVE3_FILES,
                results: str = WAVE3_RESULTS, profile: str = WAVE3_PROFILE, profiles: str | None = None,
                wave: str = "wave-3") -> list[str]:
    """Every contradiction between the history of ``repo`` and the third wave's freeze (empty:
    none): its rules or frozen inputs differ from that commit, its profile (with the models and
    architectures it uses) does, or any file under ``results`` entered git in that commit or in
    one that does not descend from it."""
    problems = _check_wave(repo, wave, frozen_at, files, ("*",), results)
    profiles_path = profiles or str(PROFILES_FILE.relative_to(REPO_ROOT))
    then = _git(Path(repo), "show", f"{frozen_at}:{profiles_path}", check=False)
    now_path = Path(repo) / profiles_path
    now = now_path.read_text(encoding="utf-8") if now_path.exists() else ""
    if then.returncode != 0 or not frozen_settings(now, profile) or \
            frozen_settings(then.stdout, profile) != frozen_settings(now, profile):
        problems.append(f"the {profile!r} profile (or a model or architecture it uses) in {profiles_path} differs "
                        f"from the {wave} freezing commit {frozen_at[:10]}")
    return problems


def check_wave4(repo: Path = REPO_ROOT, frozen_at: str = WAVE4_FROZEN_AT, files: Sequence[str] = WAVE4_FILES,
                results: str = WAVE4_RESULTS, profile: str = WAVE4_PROFILE, profiles: str | None = None) -> list[str]:
    """The fourth wave's contradictions, checked as the third's (:func:`check_wave3`): its rules,
    frozen inputs and profile as at ``WAVE4_FROZEN_AT``, every file under ``results`` after it."""
    return check_wave3(repo, frozen_at, files, results, profile, profiles, wave="wave-4")


def _check_wave(repo: Path, wave: str, frozen_at: str, files: Sequence[str], patterns: Sequence[str],
                results: str) -> list[str]:
    repo = Path(repo)
    if _git(repo, "rev-parse", "--git-dir", check=False).returncode != 0:
        raise HistoryUnavailable(f"{repo} is not a git checkout")
    if _git(repo, "cat-file", "-e", f"{frozen_at}^{{commit}}", check=False).returncode != 0:
        raise HistoryUnavailable(f"the {wave} freezing commit {frozen_at} is not in this clone's history")
    problems = [f"{f} differs from the {wave} freezing commit {frozen_at[:10]}" for f in files
                if _git(repo, "diff", "--quiet", frozen_at, "--", f, check=False).returncode != 0]
    tracked = {line for line in _git(repo, "ls-files", "--", results).stdout.splitlines()
               if any(fnmatch.fnmatchcase(line, p) for p in patterns)}
    return problems + _added_before(repo, frozen_at, results, tracked)
