"""scripts/offline_bundle.py: the parts a GPU machine without a package index is carried, each
small enough to travel beside the checkout, joined there only when whole and unaltered."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

import pytest

from plugin_lib.harness.profile import REPO_ROOT

spec = importlib.util.spec_from_file_location("offline_bundle", REPO_ROOT / "scripts" / "offline_bundle.py")
offline_bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(offline_bundle)


def _carry(tmp_path, payload: bytes, part_bytes: int):
    bundle = tmp_path / "bundle.tar"
    bundle.write_bytes(payload)
    count = offline_bundle.split(bundle, tmp_path / "carry", part_bytes)
    return count, tmp_path / "carry"


def test_the_parts_stashed_one_transfer_at_a_time_join_into_the_bundle(tmp_path):
    payload = os.urandom(2500)
    count, carry = _carry(tmp_path, payload, 1000)
    assert count == 3 and sorted(p.name for p in carry.iterdir()) == ["part-00", "part-01", "part-02"]
    assert max(p.stat().st_size for p in carry.glob("part-*/bundle.*[0-9]")) == 1000
    stash = tmp_path / "stash"
    for part in sorted(carry.iterdir()):  # each device-tool call carries one part folder
        call = tmp_path / f"call-{part.name}"
        shutil.copytree(part, call / part.name)
        offline_bundle.stash(call, stash)
    assert offline_bundle.join(stash) == payload


def test_a_missing_or_altered_part_is_refused(tmp_path):
    count, carry = _carry(tmp_path, os.urandom(2500), 1000)
    stash = tmp_path / "stash"
    offline_bundle.stash(carry, stash)
    (stash / "bundle.02").unlink()
    with pytest.raises(SystemExit, match="2 of 3 parts are in .*stash the others first"):
        offline_bundle.join(stash)
    offline_bundle.stash(carry, stash)
    (stash / "bundle.01").write_bytes(b"x" * 1000)
    with pytest.raises(SystemExit, match="do not match the bundle's checksum"):
        offline_bundle.join(stash)
    with pytest.raises(SystemExit, match="no bundle.sha256; stash part-00 first"):
        offline_bundle.join(tmp_path / "carry" / "part-01")


def test_a_part_and_the_checkout_fit_one_transfer(tmp_path):
    part_mb = offline_bundle.part_mb_for(34_200_000)
    assert part_mb == 28.0  # 64 MiB is 67.1 MB: 34.2 of checkout, 4 of margin, 28 whole MB left
    assert 34_200_000 + part_mb * 1e6 + offline_bundle.MARGIN_BYTES <= offline_bundle.TRANSFER_BYTES
    with pytest.raises(SystemExit, match="give --part-mb, or carry less in the checkout"):
        offline_bundle.part_mb_for(60_000_000)


def test_the_checkout_counts_what_travels_and_not_what_git_ignores(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("ignored/\n")
    (tmp_path / "tracked.txt").write_bytes(b"a" * 100)
    (tmp_path / "untracked.txt").write_bytes(b"b" * 30)
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "part.bin").write_bytes(b"c" * 5000)
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.txt", ".gitignore"], check=True)
    assert offline_bundle.checkout_bytes(tmp_path) == 100 + 30 + len("ignored/\n")
