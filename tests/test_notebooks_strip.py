import importlib.util
import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

_spec = importlib.util.spec_from_file_location("strip_notebook", REPO_ROOT / "scripts" / "strip_notebook.py")
_strip = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_strip)
strip_notebook = _strip.strip_notebook


def test_strip_drops_images_timing_and_machine_paths(tmp_path):
    nb = {
        "cells": [{
            "cell_type": "code", "source": "x", "metadata": {"papermill": {"duration": 1.0}},
            "outputs": [
                {"output_type": "display_data", "data": {"image/png": "AAAA"}, "metadata": {}},
                {"output_type": "stream", "name": "stdout", "text": [f"saved {REPO_ROOT}/results/a.csv\n"]},
            ],
        }],
        "metadata": {"papermill": {"input_path": "/abs/in.ipynb", "parameters": {"profile": "smoke"}}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    strip_notebook(path)
    out = json.loads(path.read_text())
    outputs = out["cells"][0]["outputs"]
    assert len(outputs) == 1 and outputs[0]["text"] == "saved results/a.csv\n"
    assert "papermill" not in out["cells"][0]["metadata"]
    assert out["metadata"]["papermill"] == {"parameters": {"profile": "smoke"}}
