"""Tests that read the real datasets skip, saying how to get them, when these are not there.

``require("e2e", ...)`` returns the data folder (``data/`` or ``PLUGIN_DATA_DIR``) when every
file of the named groups is there and checks out, and skips the test otherwise: a fresh clone
without data runs green, and the skip message tells a user the one command that fetches them.
"""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from plugin_lib.data import integrity, sources
from plugin_lib.data.datasets import data_dir, describe_data_dir

FETCH = "`.venv/bin/python -m plugin_lib.data.fetch` gets them (data/README.md; Adidas needs a Kaggle account)"


@functools.lru_cache(maxsize=None)
def _missing(groups: tuple[str, ...]) -> str | None:
    """Why the groups' data are not usable here, or None."""
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
    why = _missing(tuple(groups or sources.GROUPS))
    if why is not None:
        pytest.skip(f"needs the real datasets: {why}; {FETCH}")
    return data_dir()
