"""Locks and temporaries that name their owner, for a run store shared by many processes on
many hosts (one filesystem: local, NFS, Lustre).

``StoreLock(path)`` is a lock file created with ``O_CREAT | O_EXCL`` (atomic on local disks
and NFS v3+) that holds its owner's host, pid and a random nonce. A waiter takes over a lock
whose owner is gone: on this host, a pid that no longer runs; on another host, a lock not
touched for ``foreign_stale_s`` (a holder touches its lock every ``heartbeat_s`` from a
thread). The takeover renames the lock to a name of the taker's own, so two takers cannot both
win, and puts back (by a hard link, which never overwrites) a lock that turned out to be live.

``owner_tag()`` is the ``host~pid`` that atomic writes put in their temporaries' names, and
``owner_gone(tag)`` says whether such a file's writer has ended (None: cannot tell, another
host), so that temporaries are reaped only when their owner is gone.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path

OWNER_SEP = "~"


def host_name() -> str:
    """This host's name, safe in a file name."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname()) or "host"


def owner_tag(pid: int | None = None) -> str:
    return f"{host_name()}{OWNER_SEP}{pid or os.getpid()}"


def pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def owner_gone(tag: str) -> bool | None:
    """True when the ``host~pid`` owner has ended; False while it runs; None for a tag of
    another host, or not a tag at all (the caller falls back on the file's age)."""
    host, sep, pid = tag.rpartition(OWNER_SEP)
    if not sep or not pid.isdigit() or host != host_name():
        return None
    return not pid_running(int(pid))


class LockTimeout(TimeoutError):
    """The lock stayed held by a live owner for longer than the caller would wait."""


class StoreLock:
    """``with StoreLock(path): ...``: exclusive across processes and hosts; re-entrant within
    one thread is not supported (a second ``acquire`` by the holder waits for itself)."""

    def __init__(self, path: str | os.PathLike, *, poll_s: float = 0.2, timeout_s: float | None = None,
                 heartbeat_s: float = 30.0, foreign_stale_s: float = 300.0):
        self.path = Path(path)
        self.poll_s, self.timeout_s = poll_s, timeout_s
        self.heartbeat_s, self.foreign_stale_s = heartbeat_s, foreign_stale_s
        self.nonce: str | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def holder(self) -> dict | None:
        """The current owner's record, or None when nobody holds the lock."""
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (ValueError, OSError):  # being written this instant, or torn by a crash
            return {"host": None, "pid": None, "nonce": None}

    def busy(self) -> bool:
        """Whether a live owner holds it now (an abandoned lock is free to take over)."""
        held = self.holder()
        return held is not None and not self._abandoned(held)

    def acquire(self, blocking: bool = True) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            if self._try_create():
                self._start_heartbeat()
                return True
            held = self.holder()
            if held is not None and self._abandoned(held):
                self._take_over(held)
                continue
            if not blocking:
                return False
            if deadline is not None and time.monotonic() > deadline:
                raise LockTimeout(f"{self.path} is held by {held} (still running); waited {self.timeout_s} s.")
            time.sleep(self.poll_s)

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        held = self.holder()
        if held is not None and held.get("nonce") == self.nonce:
            self.path.unlink(missing_ok=True)
        self.nonce = None

    def __enter__(self) -> "StoreLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # -- internals

    def _try_create(self) -> bool:
        nonce = secrets.token_hex(8)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump({"host": host_name(), "pid": os.getpid(), "nonce": nonce, "since": time.time()}, f)
        self.nonce = nonce
        return True

    def _abandoned(self, held: dict) -> bool:
        if held.get("host") == host_name() and isinstance(held.get("pid"), int):
            return not pid_running(held["pid"])
        try:  # another host (or a record torn by a crash): judged by its heartbeat
            return time.time() - self.path.stat().st_mtime > self.foreign_stale_s
        except FileNotFoundError:
            return False

    def _take_over(self, held: dict) -> None:
        aside = self.path.with_name(f"{self.path.name}.stale-{owner_tag()}-{secrets.token_hex(4)}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:  # released, or another waiter took it over first
            return
        try:
            moved = json.loads(aside.read_text())
        except (ValueError, OSError):
            moved = {}
        if moved.get("nonce") != held.get("nonce") and not self._abandoned_record(moved):
            try:  # a live owner's lock, created after we looked: put it back, never over another
                os.link(aside, self.path)
            except FileExistsError:
                pass
        aside.unlink(missing_ok=True)

    def _abandoned_record(self, record: dict) -> bool:
        return (record.get("host") == host_name() and isinstance(record.get("pid"), int)
                and not pid_running(record["pid"]))

    def _start_heartbeat(self) -> None:
        self._stop.clear()

        def beat():
            while not self._stop.wait(self.heartbeat_s):
                try:
                    os.utime(self.path)
                except FileNotFoundError:
                    return

        self._beat = threading.Thread(target=beat, name=f"lock-heartbeat {self.path.name}", daemon=True)
        self._beat.start()
