"""What the orchestrator runs in its own process: a notebook through papermill's Python API (its
kernel is a process of its own, as Jupyter's always is), and a stretch of work whose output goes
to the screen and to a log at once, its child processes' included.

A signal that ends the orchestrator while a notebook runs must not leave the kernel computing
without its client: ``stop_children`` ends every process this one started (the kernels start in
sessions of their own, so a terminal's signal does not reach them) before the call unwinds.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

from ..harness.profile import REPO_ROOT
from ..utils import malloc

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"


def execute_notebook(notebook: Path, output: Path, log: Path, profile: str) -> bool:
    """Run ``notebook`` with ``profile`` as its parameter into ``output`` (papermill writes it as
    the cells run), every cell's output and the error, if any, into ``log``; whether it
    finished. The kernel runs in notebooks/, where the notebooks' relative paths start; what it
    and its own children (Java's tokenizer, say) write outside the cells goes to the log too."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    log.write_text("")
    logger = logging.getLogger("papermill")
    handler = logging.FileHandler(log, mode="a", encoding="utf-8")  # appends, as the kernel's descriptors do
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the cells' output goes to the log, not to the screen
    try:
        with output_sent_to(log):
            papermill.execute_notebook(str(notebook), str(output), parameters={"profile": profile},
                                       cwd=str(NOTEBOOKS_DIR), log_output=True, progress_bar=False)
        return True
    except PapermillExecutionError as err:  # a cell raised: its traceback ends the log
        logger.error(str(err))
        return False
    except Exception:  # noqa: BLE001 - a kernel that died or would not start, an unreadable notebook
        logger.error(traceback.format_exc())
        return False
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(level)
        logger.propagate = propagate


@contextlib.contextmanager
def output_sent_to(log: Path) -> Iterator[None]:
    """Within it, this process's stdout and stderr descriptors, and so those of the processes
    it starts, write to the end of ``log`` instead of the screen."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def stop_children(grace_s: float = 10.0, parent: int | None = None) -> int:
    """End every process this one started, and theirs (a notebook's kernel, a grid's workers), or
    with ``parent`` that process and its own (a gpu-check step at its deadline): SIGTERM, then
    SIGKILL after ``grace_s``; how many there were."""
    import psutil

    try:
        top = psutil.Process(parent)
        children = top.children(recursive=True) + ([top] if parent is not None else [])
    except psutil.NoSuchProcess:
        return 0
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return len(children)


@contextlib.contextmanager
def output_copied_to(log: Path) -> Iterator[None]:
    """Within it, what this process and the processes it starts write to stdout and stderr goes
    to the screen as before and into ``log`` too (a pipe in place of both descriptors, read by a
    thread that writes each chunk to both)."""
    sys.stdout.flush()
    sys.stderr.flush()
    screen = os.dup(1)
    saved = os.dup(1), os.dup(2)
    read_end, write_end = os.pipe()

    def copy() -> None:
        with open(log, "ab") as copy_to:
            while chunk := os.read(read_end, 65536):
                os.write(screen, chunk)
                copy_to.write(chunk)
                copy_to.flush()

    reader = threading.Thread(target=copy, name="output-copy", daemon=True)
    reader.start()
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)  # the pipe's last writers in this process go: the reader sees its end
        os.dup2(saved[1], 2)
        reader.join(timeout=30)  # a child still holding the pipe (killed late) must not hang us
        for fd in (*saved, read_end, screen):
            os.close(fd)


def release_grid_memory() -> None:
    """What the grid held in this process (the last base of its pool, a GPU's cached blocks)
    goes before the notebooks' kernels need the memory."""
    from ..harness.grid import units

    units.release_pool()
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    malloc.release()
