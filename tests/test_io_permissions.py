"""Files written by the package get the user's normal permissions (0666 less the umask), not the
0600 of the temporary file they are written through (issue 19)."""
import os
import stat

import pytest

from plugin_lib.utils.io import atomic_write_json, atomic_write_text, current_umask


@pytest.fixture
def umask():
    def set_mask(mask):
        os.umask(mask)
        return mask
    old = os.umask(0o022)
    os.umask(old)
    yield set_mask
    os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_atomic_writes_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    assert current_umask() == mask
    text = atomic_write_text(tmp_path / "a.txt", "hello\n")
    record = atomic_write_json(tmp_path / "sub" / "run.json", {"seed": 0})
    assert mode(text) == 0o666 & ~mask
    assert mode(record) == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_a_rewrite_gets_normal_permissions_too(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "r.json"
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"a": 2})
    assert mode(path) == 0o644
    assert path.read_text() == '{\n  "a": 2\n}\n'
