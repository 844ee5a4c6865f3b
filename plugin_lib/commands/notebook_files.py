"""An executed notebook made small, readable and portable, and the error a failed one ended with.

``strip_notebook`` (``plugin-repro run`` and ``gpu-check`` call it on every executed notebook)
replaces each figure (its image and ``<Figure ...>`` text) by a link to the PNG the cell saved
under results/<profile>/figures (``report.writer.save_figure`` prints ``figure: PATH``), drops
progress bars and tool chatter from the streams, papermill's timing metadata, and any absolute
path of the machine that ran them, so an executed notebook opens cleanly anywhere and reruns give
the same outputs.

``error_lines`` is what the orchestrator prints when a notebook fails. papermill's log ends with
the failing cell's traceback, whose last lines are the exception's name and message: the
package's own words (what to download, which path it could not write). Those lines are printed,
whatever the length of the traceback above them. For an error outside a cell (a kernel that
died, a notebook that could not be read), the final exception of the log's last Python
traceback; failing both, the log's last lines.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from ..harness.profile import REPO_ROOT
from ..utils.io import atomic_write_text

MAX_TEXT_OUTPUT = 20_000  # characters kept per cell output

FIGURE_LINE = re.compile(r"figure: (.+\.png)")  # printed by plugin_lib.report.writer.save_figure
FIGURE_REPR = re.compile(r"<Figure size [\d.]+x[\d.]+ with \d+ Axes>")  # matplotlib's text for a figure
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# One draw of a tqdm bar: "\r", then up to its "[elapsed<remaining, rate]" (timings that differ on
# every run) and padding; what follows it on the line is another writer's.
BAR = re.compile(r"\r[^\r\n]*?\[\d+:\d+(?::\d+)?(?:<[\d:?]+)?,[^\]\r\n]*\] *")
CHATTER = re.compile("|".join((
    r"PTBTokenizer tokenized \d+ tokens at [\d.]+ tokens per second\.",  # the metrics' Java tokenizer
    r".* edu\.stanford\.nlp\.process\.PTBLexer next",  # its timestamped warning header...
    r"WARNING: Untokenizable: .*",  # ...and the warning
    # core.cache's choice of layout, printed when a cache is built (the run's log keeps it): whether
    # it shows depends on what an earlier run left on disk, not on the results.
    r"base-output cache of .* pairs: layout .*",
)))
# Warnings that say nothing about the results; the indented source line after each goes too.
WARNINGS = ("TqdmWarning: IProgress not found",)


def _scrub(text: str) -> str:
    """No machine path: the environment (a PLUGIN_VENV may lie outside the checkout) reads as
    .venv/, the checkout as relative paths, the home folder as ~."""
    text = text.replace(str(Path(sys.prefix)) + "/", ".venv/")
    return text.replace(str(REPO_ROOT) + "/", "").replace(str(Path.home()), "~")


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def _visible(line: str) -> str:
    """What a terminal shows of ``line``, less progress bars: no escape codes, the last
    carriage-return rewrite."""
    parts = [p for p in BAR.sub("", ANSI.sub("", line)).split("\r") if p]
    return parts[-1] if parts else ""


def _merge_streams(outputs: list[dict]) -> list[dict]:
    """Consecutive writes to one stream as one output (papermill stores each flush apart), so
    that a progress bar's carriage returns meet the line they rewrite."""
    merged = []
    for out in outputs:
        last = merged[-1] if merged else {}
        if out.get("output_type") == "stream" and last.get("output_type") == "stream" \
                and last.get("name") == out.get("name"):
            last["text"] = _text(last["text"]) + _text(out["text"])
        else:
            merged.append(dict(out))
    return merged


def clean_stream(text: str, name: str) -> tuple[str, list[str]]:
    """(``text`` without progress bars, chatter and idle warnings, the figure paths it names).
    Blank lines go from stderr, where tqdm leaves them between its bars."""
    *lines, tail = text.split("\n")
    kept, figures, skip_source = [], [], False
    for line in lines:
        shown = _visible(line)
        if skip_source and shown[:1].isspace():
            continue
        skip_source = any(w in shown for w in WARNINGS)
        figure = FIGURE_LINE.fullmatch(shown)
        if figure:
            figures.append(figure.group(1))
        elif not (skip_source or CHATTER.fullmatch(shown) or (not shown.strip() and (line or name == "stderr"))):
            kept.append(shown)
    return "".join(f"{line}\n" for line in kept) + _visible(tail), figures


def _is_figure(data: dict) -> bool:
    """An image output, or the ``<Figure ...>`` text left of one."""
    rest = {k: v for k, v in data.items() if not k.startswith("image/")}
    if set(rest) - {"text/plain"}:
        return False
    return len(rest) < len(data) or bool(FIGURE_REPR.fullmatch(_text(rest.get("text/plain", ""))))


def _figure_link(figure: str, notebook: Path) -> dict:
    """A Markdown output showing the saved PNG, linked relative to the notebook (GitHub renders it)."""
    path = Path(figure) if Path(figure).is_absolute() else REPO_ROOT / figure
    link = Path(os.path.relpath(path, notebook.resolve().parent)).as_posix()
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/markdown": f"![{path.stem}]({link})", "text/plain": f"figure: {link}"}}


def strip_outputs(outputs: list[dict], notebook: Path) -> list[dict]:
    """A code cell's outputs, cleaned; the links to its saved figures where it showed them."""
    kept, figures, slot = [], [], None
    for out in _merge_streams(outputs):
        if out.get("output_type") == "stream":
            text, found = clean_stream(_text(out["text"]), out["name"])
            figures += found
            if text:
                kept.append({**out, "text": _scrub(text[-MAX_TEXT_OUTPUT:])})
            continue
        data = out.get("data", {})
        if _is_figure(data):
            slot = len(kept) if slot is None else slot  # the links go where the figure was shown
            continue
        if "text" in out:
            out["text"] = _scrub(_text(out["text"])[-MAX_TEXT_OUTPUT:])
        for key, value in list(data.items()):
            text = _text(value)
            if isinstance(text, str):
                data[key] = _scrub(text[:MAX_TEXT_OUTPUT])
        if out.get("output_type") == "display_data" and not data:
            continue
        kept.append(out)
    at = len(kept) if slot is None else slot
    return kept[:at] + [_figure_link(f, notebook) for f in figures] + kept[at:]


def strip_notebook(path: str | Path) -> None:
    """Clean the executed notebook at ``path`` in place (module docstring), atomically."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        cell.get("metadata", {}).pop("papermill", None)
        cell.get("metadata", {}).pop("execution", None)
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            cell["id"] = "injected-parameters"  # papermill draws a new random id on every run
        if "outputs" in cell:
            cell["outputs"] = strip_outputs(cell["outputs"], Path(path))
    params = nb.get("metadata", {}).get("papermill", {})
    for key in ("input_path", "output_path", "start_time", "end_time", "duration"):
        params.pop(key, None)
    atomic_write_text(path, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------- a failed notebook's error

MAX_LINES = 40
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
    """The lines that say why the notebook whose papermill log is ``log`` failed."""
    lines = ANSI.sub("", log).splitlines()
    found = cell_error(lines) or python_error(lines) or _trim(lines)[-20:]
    if len(found) > MAX_LINES:
        found = found[:MAX_LINES] + [f"... ({len(found) - MAX_LINES} more lines in the log)"]
    return found
