"""The stamp of an executed notebook: run_all.sh skips a notebook whose stored stamp matches.

``python scripts/run_stamp.py --profile NAME [-p KEY VALUE]... NOTEBOOK...`` prints one line per
notebook, ``<sha256>  <notebook>``. The stamp hashes only what determines the notebook's results:

- the notebook file's content;
- its papermill parameters (``profile=NAME`` and any ``-p KEY VALUE``);
- the profile's settings, ``load_profile(NAME).as_dict()``;
- the code version: the content of the package's code and data files under ``plugin_lib/``
  (``.py``, ``.yaml``, ``.csv``, ``.json``, ``.txt``: names and bytes, not git state, not
  modification times).

Nothing from the machine, the user or the environment variables enters it, so a fresh clone of
a commit whose executed notebooks were stamped skips them, and any change to a notebook, the
profile or the code runs them again. Line endings are normalised (a Windows checkout matches).
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

SCHEME = "plugin-repro run stamp v1"
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".csv", ".json", ".txt")


def _content(path: Path) -> bytes:
    return path.read_bytes().replace(b"\r\n", b"\n")


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
        digest.update(hashlib.sha256(_content(path)).hexdigest().encode("ascii") + b"\n")
    return digest.hexdigest()


def stamp(notebook: str | Path, profile: str, parameters: dict[str, str] | None = None,
          code: str | None = None) -> str:
    """The stamp of ``notebook`` run with ``profile`` and the papermill ``parameters``."""
    inputs = {
        "scheme": SCHEME,
        "notebook": hashlib.sha256(_content(Path(notebook))).hexdigest(),
        "parameters": {"profile": profile, **(parameters or {})},
        "profile": load_profile(profile).as_dict(),
        "code": code or code_version(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode("utf-8")).hexdigest()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", required=True, choices=profile_names())
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                        metavar=("KEY", "VALUE"), help="a papermill parameter passed to the notebook")
    parser.add_argument("notebooks", nargs="+")
    args = parser.parse_args(argv)
    code = code_version()
    for notebook in args.notebooks:
        print(f"{stamp(notebook, args.profile, dict(args.parameter), code)}  {notebook}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
