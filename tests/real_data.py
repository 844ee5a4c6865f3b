"""Tests that read the real datasets skip, saying how to get them, when these are not there.

``require("e2e", ...)`` returns the data folder (``data/`` or ``PLUGIN_DATA_DIR``) when every
file of the named groups is there and checks out, and skips the test otherwise: a fresh clone
without data runs green, and the skip message tells a user the one command that fetches them.

Declaring is enforced: until a test calls ``require``, ``PLUGIN_DATA_DIR`` points at an empty
folder (``conftest.undeclared_data_is_refused``), so a test that reads the data without
declaring it fails wherever it runs, CI included, where the data is present.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from plugin_lib.data import integrity, sources
from plugin_lib.data.files import data_dir, describe_data_dir

FETCH = "`.venv/bin/plugin-repro data fetch` gets them (data/README.md; Adidas needs a Kaggle account)"
UNSET = object()
# PLUGIN_DATA_DIR as the test run was given it: read at import (collection), so that a module
# fixture that declares before the first test's conftest fixture has run still finds it.
_real_setting: object = os.environ.get("PLUGIN_DATA_DIR", UNSET)


def refuse_undeclared(empty: Path) -> None:
    """Point PLUGIN_DATA_DIR at ``empty`` until ``require`` is called (the caller restores it)."""
    global _real_setting
    _real_setting = os.environ.get("PLUGIN_DATA_DIR", UNSET)
    os.environ["PLUGIN_DATA_DIR"] = str(empty)


def _declare() -> None:
    if _real_setting is UNSET:
        os.environ.pop("PLUGIN_DATA_DIR", None)
    else:
        os.environ["PLUGIN_DATA_DIR"] = _real_setting


@functools.lru_cache(maxsize=None)
def _missing(groups: tuple[str, ...], setting: str | None) -> str | None:
    """Why the groups' data are not usable here (``setting``: PLUGIN_DATA_DIR, part of the cache's
    key, since a fixture may declare before the first test has set it), or None."""
    try:
        root = data_dir()
    except FileNotFoundError as err:
        return str(err).splitlines()[0]
    if root is None:
        return "these tests read a local data folder, and PLUGIN_DATA_DIR=hub reads the Hub"
    problems, _ = integrity.check(root, list(groups))
    if problems:
        return f"the {', '.join(groups)} data are not complete in {describe_data_dir()} ({problems[0].relpath})"
    return None


def require(*groups: str) -> Path:
    """The data folder, or a skip naming what is missing and how to fetch it."""
    unknown = [g for g in groups if g not in sources.GROUPS]
    assert not unknown, f"unknown data groups {unknown}"
    _declare()
    why = _missing(tuple(groups or sources.GROUPS), os.environ.get("PLUGIN_DATA_DIR"))
    if why is not None:
        pytest.skip(f"needs the real datasets: {why}; {FETCH}")
    return data_dir()
