"""What made a stored result: the code, the libraries and the device (``provenance``).

Every new run record carries it, as HELM and lm-evaluation-harness record theirs:

- ``git``: the commit of the checkout, whether its tracked files differed from it (``dirty``),
  and then a hash of that difference (``git diff HEAD``), so that two runs from one dirty tree
  can be told apart from runs of two; ``None`` outside a git checkout (an installed package);
- ``code``: the code version the notebook stamps hash (``code_version``: the package's Python
  as syntax trees without docstrings, and its data files), which a comment or a re-wrapped line
  does not change;
- ``modules``: a hash of each method module (``METHOD_MODULES``: the core method, the baselines'
  code, the runner and the metrics), so that a report can name the module in which two runs of
  one table differ (``report.code_versions``);
- ``libraries``: torch, transformers, numpy and peft versions; ``device``: the CPU model or the
  GPU's name.

The code version is computed once per process (the package does not change under a running
process); git is asked once per process too.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import platform
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".csv", ".json", ".txt")
LIBRARIES = ("torch", "transformers", "numpy", "peft")
# The modules whose code decides a method's outputs (the Plugin and every baseline, how runs are
# keyed and scored); a report flags a table whose runs differ in one of them.
METHOD_MODULES = ("plugin_lib/core", "plugin_lib/metrics", "plugin_lib/harness/methods.py",
                  "plugin_lib/harness/baselines/tempnet.py", "plugin_lib/harness/baselines/bdpl.py",
                  "plugin_lib/harness/baselines/bdpl_rewards.py", "plugin_lib/harness/baselines/finetune.py",
                  "plugin_lib/harness/baselines/lora.py", "plugin_lib/harness/running/runner.py",
                  "plugin_lib/harness/running/run_store.py", "plugin_lib/harness/running/search.py",
                  "plugin_lib/harness/running/run_keys.py", "plugin_lib/harness/models.py")
# Where those of harness/ lay before they were put in folders by kind (2026-12-05): git's history
# of older commits names them there.
FORMER_METHOD_MODULES = tuple(path.replace("/baselines/", "/").replace("/running/", "/") for path in METHOD_MODULES
                              if "/baselines/" in path or "/running/" in path)


def file_content(path: Path) -> bytes:
    return path.read_bytes().replace(b"\r\n", b"\n")


def code_bytes(path: Path) -> bytes:
    """A Python file as its syntax tree without docstrings; other files as their bytes."""
    if path.suffix != ".py":
        return file_content(path)
    tree = ast.parse(file_content(path))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode("utf-8")


def code_files(root: Path = REPO_ROOT) -> list[Path]:
    """The package's code and data files, sorted: what the code version hashes."""
    package = root / "plugin_lib"
    return sorted(
        p for p in package.rglob("*")
        if p.is_file() and p.suffix in CODE_SUFFIXES
        and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(package).parts)
    )


def code_version(root: Path = REPO_ROOT) -> str:
    digest = hashlib.sha256()
    for path in code_files(root):
        digest.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        digest.update(hashlib.sha256(code_bytes(path)).hexdigest().encode("ascii") + b"\n")
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _process_code_version() -> str:
    return code_version()


@functools.lru_cache(maxsize=1)
def module_versions(root: Path = REPO_ROOT) -> dict[str, str]:
    """A short hash of each method module's code (``code_bytes``), by its path in the repository."""
    versions = {}
    for path in code_files(root):
        name = path.relative_to(root).as_posix()
        if path.suffix == ".py" and any(name == m or name.startswith(m + "/") for m in METHOD_MODULES):
            versions[name] = hashlib.sha256(code_bytes(path)).hexdigest()[:12]
    return versions


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode("utf-8", "replace")


@functools.lru_cache(maxsize=1)
def git_state() -> dict | None:
    """The checkout's commit, and whether (and how) its tracked files differ from it."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return None
    diff = _git("diff", "HEAD", "--binary") or ""
    state = {"commit": commit.strip(), "dirty": bool(diff)}
    if diff:
        state["diff_sha256"] = hashlib.sha256(diff.encode("utf-8")).hexdigest()
    return state


def library_versions() -> dict[str, str | None]:
    from importlib import metadata

    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_name(device=None) -> str:
    """The GPU's name for a CUDA device, else the CPU model (``/proc/cpuinfo``, or platform's)."""
    import torch

    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(device=None) -> dict:
    """What made a result produced now, on ``device`` (module docstring)."""
    return {"git": git_state(), "code": _process_code_version(), "modules": module_versions(),
            "libraries": library_versions(), "device": device_name(device)}
