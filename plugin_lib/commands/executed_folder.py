"""results/<profile>/executed: each notebook's last finished execution, its stamp, its failed try.

For every notebook ``plugin-repro run`` executes, the folder holds

  <name>.ipynb          the last execution that finished, stripped (``notebook_files``)
  <name>.done           its stamp (``commands.stamp``): the notebook is skipped while it matches
  <name>.seconds        one line per finished execution, its wall-clock seconds
  <name>.failed.ipynb   the last failed try (gone once a later try finishes, or fails unwritten)

A try runs into a hidden temporary file that replaces <name>.ipynb only when the notebook
finished and was stripped; its stamp is written after it, so a killed call never leaves a stamp
that vouches for a notebook it did not write. A notebook that skipped its study for want of an
optional engine (14 without llama-cpp-python's server) keeps the last execution that ran it.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..utils.io import read_json
from .execution import NOTEBOOKS_DIR, execute_notebook


class ExecutedFolder:
    """The executed/ folder of one results folder ``out`` (``shown`` names it in messages); with
    ``force`` no stamp counts as finished."""

    def __init__(self, out: Path, shown: str, profile: str, force: bool = False):
        self.out, self.shown, self.profile, self.force = out, shown, profile, force
        self.folder = out / "executed"
        self.temporary: Path | None = None  # the try running now, removed by ``discard``
        self.mode = 0o666 & ~_umask()  # what the user's umask gives a new file

    def prepare(self) -> None:
        """The folder, without the temporary files of a call killed outright (the caller holds the
        profile's lock, so no other call is writing them)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for left in self.folder.glob(".*.running.*.ipynb"):
            left.unlink(missing_ok=True)

    def finished(self, name: str, wanted: str) -> bool:
        """Whether ``name``'s last execution is stored with the stamp ``wanted``."""
        stamp, final = self.folder / f"{name}.done", self.folder / f"{name}.ipynb"
        return (not self.force and stamp.is_file() and final.is_file()
                and stamp.read_text().strip() == wanted)

    def execute(self, name: str, wanted: str, count: str) -> None:
        """Run one notebook with papermill into a temporary file, moved into place on success; a
        failure keeps the last execution and stops the call with status 1 (``SystemExit``)."""
        final, failed, stamp = (self.folder / f"{name}{suffix}" for suffix in (".ipynb", ".failed.ipynb", ".done"))
        if self.finished(name, wanted):
            print(f"[run] {count} {name}: already finished, skipped (--force re-runs it)", flush=True)
            return
        log = self.out / "logs" / f"{name}.log"
        print(f"[run] {count} {name}: running (log: {self.shown}/logs/{name}.log)", flush=True)
        started, skips_before = time.monotonic(), self._skips()
        self.temporary = self.folder / f".{name}.running.{os.getpid()}.ipynb"
        done = execute_notebook(NOTEBOOKS_DIR / f"{name}.ipynb", self.temporary, log, self.profile)
        if done and _strip(self.temporary, log):
            if self._kept_real_execution(name, final, skips_before, count):
                return
            self.temporary.chmod(self.mode)
            os.replace(self.temporary, final)
            self.temporary = None
            failed.unlink(missing_ok=True)
            seconds = round(time.monotonic() - started)
            with open(self.folder / f"{name}.seconds", "a", encoding="utf-8") as f:
                f.write(f"{seconds}\n")
            written = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
            written.write_text(wanted + "\n")
            written.chmod(self.mode)
            os.replace(written, stamp)
            print(f"[run] {count} {name}: done in {seconds} s", flush=True)
            return
        self._failed(name, log, final, failed)

    def discard(self) -> None:
        """The try running now, unfinished (a signal, an error): its temporary file goes."""
        if self.temporary is not None:
            self.temporary.unlink(missing_ok=True)
            self.temporary = None

    def _skips(self) -> dict[Path, float]:
        """The notebooks' records of what they skipped (report.writer.save_skip), with their times."""
        return {path: path.stat().st_mtime for path in (self.out / "skipped").glob("*.json")}

    def _kept_real_execution(self, name: str, final: Path, skips_before: dict[Path, float], count: str) -> bool:
        """A try that skipped its study for want of an optional engine does not replace a last
        execution that ran it: that execution, its results and its stamp stay, and the new skip
        records go. True when so."""
        new = [path for path, when in self._skips().items() if skips_before.get(path) != when]
        if not new or not final.is_file() or any(path in skips_before for path in new):
            return False
        reasons = "; ".join(read_json(path).get("reason", "") for path in new)
        for path in new:
            path.unlink(missing_ok=True)
        self.discard()
        print(f"[run] {count} {name}: skipped its study ({reasons}); the last execution that ran it, "
              f"{self.shown}/executed/{name}.ipynb, and its results are kept, and its stamp stays stale", flush=True)
        return True

    def _failed(self, name: str, log: Path, final: Path, failed: Path) -> None:
        """The last executed notebook and its stamp stay; this try is kept as <name>.failed.ipynb."""
        from .notebook_files import error_lines

        if self.temporary is not None and self.temporary.exists() and self.temporary.stat().st_size:
            _strip(self.temporary, None)
            self.temporary.chmod(self.mode)
            os.replace(self.temporary, failed)
            self.temporary = None
        else:
            self.discard()
            failed.unlink(missing_ok=True)
        print(f"[run] FAILED: {name}. Its error:", file=sys.stderr)
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        print("\n".join(f"    {line}" for line in error_lines(text)), file=sys.stderr)
        print(f"[run] Full log: {self.shown}/logs/{name}.log", file=sys.stderr)
        if failed.exists():
            print(f"[run] The failed notebook: {self.shown}/executed/{name}.failed.ipynb", file=sys.stderr)
        if final.exists():
            print(f"[run] {self.shown}/executed/{name}.ipynb (the last finished execution) is unchanged; nothing "
                  "else was written.", file=sys.stderr)
        raise SystemExit(1)


def _strip(path: Path, log: Path | None) -> bool:
    """The executed notebook made portable (``notebook_files.strip_notebook``); whether it was."""
    from .notebook_files import strip_notebook

    try:
        strip_notebook(path)
        return True
    except (OSError, ValueError) as err:
        if log is not None:
            with open(log, "a", encoding="utf-8") as out:
                out.write(f"stripping {path.name} failed: {err!r}\n")
        return False


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
