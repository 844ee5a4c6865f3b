"""Keeping executed notebooks small and portable.

``python scripts/strip_notebook.py NOTEBOOK...`` (run_all.sh calls it) drops bulky outputs (images are kept
as files under results/<profile>/figures instead), papermill's timing metadata, and any
absolute path of the machine that ran them, so an executed notebook opens cleanly anywhere.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
from plugin_lib.utils.io import atomic_write_text  # noqa: E402

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
    if not argv:
        print("usage: python scripts/strip_notebook.py NOTEBOOK...", file=sys.stderr)
        return 2
    for path in argv:
        strip_notebook(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
