"""Keeping executed notebooks small and portable.

``python -m plugin_lib.notebooks strip NOTEBOOK...`` drops bulky outputs (images are kept
as files under results/<profile>/figures instead), papermill's timing metadata, and any
absolute path of the machine that ran them, so an executed notebook opens cleanly anywhere.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .config import REPO_ROOT
from .io import atomic_write_text

MAX_TEXT_OUTPUT = 20_000  # characters kept per cell output


def _scrub(text: str) -> str:
    return text.replace(str(REPO_ROOT) + "/", "").replace(str(Path.home()), "~")


def strip_notebook(path: str | Path) -> None:
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        cell.get("metadata", {}).pop("papermill", None)
        cell.get("metadata", {}).pop("execution", None)
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            for key in [k for k in data if k.startswith("image/")]:
                del data[key]  # figures live in results/<profile>/figures
            if "text" in out:
                text = "".join(out["text"]) if isinstance(out["text"], list) else out["text"]
                out["text"] = _scrub(text[-MAX_TEXT_OUTPUT:])
            for key, value in list(data.items()):
                text = "".join(value) if isinstance(value, list) else value
                if isinstance(text, str):
                    data[key] = _scrub(text[:MAX_TEXT_OUTPUT])
            if out.get("output_type") == "display_data" and not data:
                continue
            outputs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outputs
    params = nb.get("metadata", {}).get("papermill", {})
    for key in ("input_path", "output_path", "start_time", "end_time", "duration"):
        params.pop(key, None)
    atomic_write_text(path, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "strip":
        print("usage: python -m plugin_lib.notebooks strip NOTEBOOK...", file=sys.stderr)
        return 2
    for path in argv[1:]:
        strip_notebook(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
