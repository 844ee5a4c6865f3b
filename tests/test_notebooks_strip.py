import json

from plugin_lib.config import REPO_ROOT
from plugin_lib.notebooks import strip_notebook


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
