"""A test reads the real datasets only after declaring them (``real_data.require``): until then
every read fails, even where the data is present, so CI (which has the data) catches a test that
would fail on a fresh clone without it (``conftest.undeclared_data_is_refused``)."""
from __future__ import annotations

import os

import pytest

import real_data
from plugin_lib import data


def test_an_undeclared_read_fails_even_where_the_data_is_present():
    with pytest.raises(data.MissingDataError, match="undeclared-data-call-real_data.require-first"):
        data.load_dataset("e2e", "test", rows=1)


def test_a_declared_read_sees_the_real_data_or_skips_saying_how_to_get_it():
    folder = real_data.require("e2e")
    assert "undeclared" not in str(folder) and "undeclared" not in os.environ.get("PLUGIN_DATA_DIR", "")
    assert len(data.load_dataset("e2e", "test", rows=1)) == 1
