"""The base-output cache's files on disk: the temporaries a killed build leaves (named after
their writer, ``host~pid``), and disk space reserved before a memory-mapped write, so that a
full disk shows as an error that says what to do rather than a SIGBUS."""
from __future__ import annotations

import errno
import os
import shutil
import socket
import time
from pathlib import Path

STALE_PARTIAL_S = 3600


def current_umask() -> int:
    """The process's umask (read by setting it, then restored)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def owner_tag() -> str:
    """``host~pid`` of this process, safe in a file name (``utils.locks`` writes the same tags;
    the core imports nothing above it)."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname()) or "host"
    return f"{host}~{os.getpid()}"


def _owner_ended(tag: str) -> bool:
    """True when ``tag`` names a process of this host that no longer runs."""
    host, _, pid = tag.rpartition("~")
    if not pid.isdigit() or host != owner_tag().rpartition("~")[0]:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # runs, as another user
        return False
    return False


def remove_stale_partials(directory: Path, max_age_s: float = STALE_PARTIAL_S,
                          pattern: str = ".base-*.partial") -> list[Path]:
    """Remove ``pattern`` files in ``directory`` (``.<name>.<host~pid>.<random>.<suffix>``) left
    by a killed writer: at once when its process (named in the file) has ended on this host,
    otherwise once untouched for ``max_age_s`` seconds (a live cache build touches its file after
    every batch). The default: the base-output cache's builds."""
    removed, cutoff = [], time.time() - max_age_s
    for partial in Path(directory).glob(pattern):
        parts = partial.name.split(".")
        try:
            if (len(parts) >= 4 and _owner_ended(parts[-3])) or partial.stat().st_mtime < cutoff:
                partial.unlink()
                removed.append(partial)
        except FileNotFoundError:
            pass
    return removed


def reserve_disk_space(path: Path) -> None:
    """Give the (sparse) file ``path`` disk blocks for all its bytes now.

    A write into a memory-mapped page that a full disk cannot back kills the process with
    SIGBUS instead of raising, so a full disk must show before the first write, as an OSError
    that says what to do. Where the filesystem cannot allocate ahead, its free space is checked.
    """
    size = path.stat().st_size
    if hasattr(os, "posix_fallocate"):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as err:
            if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # not "unsupported here"
                raise _no_disk_space(path, size, err.strerror) from err
        finally:
            os.close(fd)
    if shutil.disk_usage(path.parent).free < size:
        raise _no_disk_space(path, size, "not enough free space")


def _no_disk_space(path: Path, size: int, reason: str) -> OSError:
    """The error for a cache file that does not fit; removes the file first, so that the free
    space it reports is what the disk has without it."""
    path.unlink(missing_ok=True)
    free = shutil.disk_usage(path.parent).free
    return OSError(
        errno.ENOSPC,
        f"The base-output cache needs {size / 2**20:,.1f} MiB on disk in {path.parent} but could not get it "
        f"({reason}; {free / 2**20:,.1f} MiB free). Free disk space there, or point PLUGIN_RESULTS_DIR "
        "(the runs and their cache folders) or the cache's directory=... at a larger disk, and run again.",
    )
