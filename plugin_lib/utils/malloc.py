"""glibc's allocator settings for tensor work on a CPU, as a ``GLIBC_TUNABLES`` value.

glibc serves an allocation above its mmap threshold (at most 32 MiB) with fresh pages, which the
kernel zero-fills on first touch, and returns them on free. A training or decoding step makes
and frees several tensors of (tokens x 49,152) floats, so every step page-faults hundreds of
MiB: in the confirmation's workers half the CPU time was the kernel's. Raising the mmap threshold
(the tensors come from the heap) and the trim threshold (the heap is not handed back) lets freed
blocks be reused. Results are bitwise the same; benchmarks/bench_malloc.py measures the gain.

glibc reads the tunables when a process starts, so they are set for child processes: the
scripts export them (``python -m plugin_lib.utils.malloc`` prints the value), the grid forwards
them to its Ray and Slurm workers, and the grid's command restarts itself with them
(``restart_with_tunables``). Elsewhere (musl, macOS) the variable is ignored.

With nothing trimmed, a long-lived process keeps the high-water mark of all it ran (a Ray worker
of the confirmation grew to 8.8 GB over several units). ``release`` hands the free pages back
between units of work: after each trained configuration and each grid unit.
"""
from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence

TUNABLES = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=68719476736"


def tunables(current: str | None = None) -> str:
    """``GLIBC_TUNABLES`` with these malloc settings: ``current`` kept as it is when it already
    sets malloc tunables of its own, otherwise extended with them."""
    current = os.environ.get("GLIBC_TUNABLES", "") if current is None else current
    if "glibc.malloc." in current:
        return current
    return f"{current}:{TUNABLES}" if current else TUNABLES


def release() -> bool:
    """Hand the heap's free pages back to the kernel (glibc's ``malloc_trim``); whether any were.
    False without glibc."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    return bool(trim(0))


def restart_with_tunables(argv: Sequence[str] | None = None) -> None:
    """Replace this process by ``argv`` (by default its own command line, ``sys.orig_argv``)
    started with these settings, on Linux when it started without malloc tunables; else return."""
    if sys.platform != "linux" or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return
    argv = list(argv or sys.orig_argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, {**os.environ, "GLIBC_TUNABLES": tunables()})


if __name__ == "__main__":
    print(tunables())
