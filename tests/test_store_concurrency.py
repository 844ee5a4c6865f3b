"""A run store shared by many processes: locks that name their owner and are taken over only
when it is gone, temporaries reaped only when their writer has ended, a grid search that two
processes run at once without training a configuration twice or losing one, and a process
killed (SIGKILL) in the middle of a unit, after which a rerun redoes that unit alone."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plugin_lib.utils.io import atomic_write_json, read_json, remove_stale_temporaries, temporary_prefix
from plugin_lib.utils.locks import StoreLock, host_name, owner_gone, owner_tag

WORKER = Path(__file__).parent / "store_worker.py"
TAGS = ["lr=0.001-weight_decay=0.01", "lr=0.002-weight_decay=0.01", "lr=0.005-weight_decay=0.01"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_lock_excludes_a_second_holder_and_names_its_owner(tmp_path):
    path = tmp_path / "unit.lock"
    with StoreLock(path) as held:
        record = held.holder()
        assert record["host"] == host_name() and record["pid"] == os.getpid()
        other = subprocess.run([sys.executable, "-c", "import sys; from plugin_lib.utils.locks import StoreLock; "
                                f"sys.exit(0 if StoreLock({str(path)!r}).acquire(blocking=False) else 3)"])
        assert other.returncode == 3  # a live owner: not taken
    assert not path.exists()


def test_a_dead_owners_lock_is_taken_over_and_a_live_foreign_one_is_not(tmp_path):
    dead = tmp_path / "dead.lock"
    dead.write_text(json.dumps({"host": host_name(), "pid": _dead_pid(), "nonce": "x"}))
    lock = StoreLock(dead)
    assert lock.acquire(blocking=False) and lock.holder()["pid"] == os.getpid()
    lock.release()

    foreign = tmp_path / "foreign.lock"
    foreign.write_text(json.dumps({"host": "another-host", "pid": 1, "nonce": "y"}))
    assert not StoreLock(foreign, foreign_stale_s=300).acquire(blocking=False)  # its heartbeat is fresh
    os.utime(foreign, (time.time() - 600,) * 2)
    taker = StoreLock(foreign, foreign_stale_s=300)
    assert taker.acquire(blocking=False)  # silent for ten minutes: its host is gone
    taker.release()


def test_temporaries_are_reaped_only_when_their_writer_has_ended(tmp_path):
    target = tmp_path / "record.json"
    mine = tmp_path / f"{temporary_prefix(target)}abc.tmp"
    ended = tmp_path / f".record.json.{owner_tag(_dead_pid())}.def.tmp"
    foreign_recent = tmp_path / ".record.json.another-host~12.ghi.tmp"
    for path in (mine, ended, foreign_recent):
        path.write_text("partial")
    os.utime(mine, (time.time() - 7200,) * 2)  # old, but its writer (this process) still runs
    assert remove_stale_temporaries(tmp_path) == [ended]
    assert mine.exists() and foreign_recent.exists()
    assert owner_gone(owner_tag()) is False and owner_gone("another-host~12") is None
    atomic_write_json(target, {"a": 1})
    assert read_json(target) == {"a": 1}


def _worker(store: Path, log: Path, sleep_s: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "PLUGIN_RESULTS_DIR": str(store), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(WORKER), str(store / "cache"), str(log), str(sleep_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _events(log: Path) -> list[tuple[str, str, int]]:
    return [(kind, tag, int(pid)) for kind, tag, pid in (line.split() for line in log.read_text().splitlines())]


def _selection(store: Path) -> dict:
    [path] = store.rglob("Plugin-selection.json")
    return read_json(path)


@pytest.mark.slow
def test_two_processes_search_one_grid_without_training_a_configuration_twice(tmp_path):
    log = tmp_path / "log"
    workers = [_worker(tmp_path / "store", log, sleep_s=1.0) for _ in range(2)]
    outputs = [w.communicate(timeout=600) for w in workers]
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-2000:]
        assert json.loads(out.splitlines()[-1])["configs"] == TAGS  # each sees the whole grid
    ends = [tag for kind, tag, _ in _events(log) if kind == "end"]
    assert sorted(ends) == ["lr=0.001", "lr=0.002", "lr=0.005"]  # every configuration once, by one of them
    record = _selection(tmp_path / "store")
    assert sorted(record["configs"]) == TAGS
    assert record["best"] == min(record["configs"], key=lambda t: record["configs"][t]["val_loss"])
    assert not list((tmp_path / "store").rglob("*.tmp")) and not list((tmp_path / "store").rglob("*.partial"))
    assert not list((tmp_path / "store").rglob(".checkpoints/*"))  # each training's state, removed once recorded


@pytest.mark.slow
def test_a_process_killed_mid_unit_loses_nothing_and_the_rerun_redoes_that_unit(tmp_path):
    log, store = tmp_path / "log", tmp_path / "store"
    doomed = _worker(store, log, sleep_s=30.0)
    deadline = time.monotonic() + 300
    while not (log.exists() and [e for e in _events(log) if e[0] == "trained"]):
        assert time.monotonic() < deadline and doomed.poll() is None, doomed.communicate()[1][-2000:]
        time.sleep(0.2)
    doomed.send_signal(signal.SIGKILL)  # trained, not yet recorded: in the middle of its first unit
    doomed.wait()
    assert not list(store.rglob("Plugin-selection.json"))  # no partial record
    assert list(store.rglob("*.lock"))  # its locks stay behind, naming a dead owner

    rerun = _worker(store, log)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err[-2000:]
    events = _events(log)
    assert [e[1] for e in events if e[0] == "start"].count("lr=0.001") == 2  # the killed unit, redone
    assert sorted(tag for kind, tag, pid in events if kind == "end") == ["lr=0.001", "lr=0.002", "lr=0.005"]
    assert sorted(_selection(store)["configs"]) == TAGS
