"""The error a failed notebook ended with: ``python scripts/notebook_error.py PAPERMILL_LOG``.

run_all.sh prints it when a notebook fails. papermill's log ends with the failing cell's
traceback, whose last lines are the exception's name and message: the package's own words
(what to download, which path it could not write). Those lines are printed, whatever the length
of the traceback above them. For an error outside a cell (a kernel that died, a notebook that
could not be read), the final exception of the log's last Python traceback; failing both, the
log's last lines.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

MAX_LINES = 40
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HEADER = re.compile(r"^(\S+)\s+Traceback \(most recent call last\)\s*$")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")


def _trim(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    while lines and not lines[0].strip():
        lines = lines[1:]
    return lines


def cell_error(lines: list[str]) -> list[str] | None:
    """The exception lines of papermill's "Exception encountered at" block, if there is one."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Exception encountered at")]
    if not starts:
        return None
    block = lines[starts[-1] + 1:]
    headers = [i for i, line in enumerate(block) if HEADER.match(line)]
    if headers:
        first = headers[-1]
        name = HEADER.match(block[first]).group(1).split(".")[-1]
        final = re.compile(rf"^(?:[\w.]+\.)?{re.escape(name)}(?::|\s*$)")
        frames = [i for i in range(first + 1, len(block)) if block[i].startswith(("File ", "Cell In"))]
        for i in range((frames[-1] if frames else first) + 1, len(block)):
            if final.match(block[i]):
                return _trim(block[i:])
    for i in range(len(block) - 1, -1, -1):  # no header (a SyntaxError, say)
        if EXCEPTION_LINE.match(block[i]):
            return _trim(block[i:])
    return _trim([line for line in block if not set(line.strip()) <= {"-"}])[-MAX_LINES:]


def python_error(lines: list[str]) -> list[str] | None:
    """The final exception of the log's last Python traceback."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    block = lines[starts[-1] + 1:]
    for i, line in enumerate(block):
        if line.strip() and not line.startswith((" ", "\t")):
            return _trim(block[i:])
    return None


def error_lines(log: str) -> list[str]:
    lines = ANSI.sub("", log).splitlines()
    found = cell_error(lines) or python_error(lines) or _trim(lines)[-20:]
    if len(found) > MAX_LINES:
        found = found[:MAX_LINES] + [f"... ({len(found) - MAX_LINES} more lines in the log)"]
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/notebook_error.py PAPERMILL_LOG", file=sys.stderr)
        return 2
    text = Path(argv[0]).read_text(encoding="utf-8", errors="replace")
    print("\n".join(error_lines(text)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
