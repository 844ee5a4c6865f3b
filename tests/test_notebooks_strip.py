import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

from plugin_lib.commands.notebook_files import strip_notebook  # noqa: E402


def test_strip_drops_images_timing_and_machine_paths(tmp_path):
    nb = {
        "cells": [{
            "cell_type": "code", "source": "x", "metadata": {"papermill": {"duration": 1.0}},
            "outputs": [
                {"output_type": "display_data", "data": {"image/png": "AAAA"}, "metadata": {}},
                {"output_type": "stream", "name": "stdout", "text": [f"saved {REPO_ROOT}/results/a.csv\n"]},
            ],
        }, {"cell_type": "code", "source": "profile = 'smoke'", "id": "3f2a9c1d", "outputs": [],
            "metadata": {"tags": ["injected-parameters"]}}],
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
    assert out["cells"][1]["id"] == "injected-parameters"  # not papermill's random one: no diff per run


def _strip_outputs(tmp_path, outputs):
    """``outputs`` of one code cell after stripping, the notebook in results/local/executed."""
    path = tmp_path / "results" / "local" / "executed" / "nb.ipynb"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "x", "metadata": {}, "outputs": outputs}],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    strip_notebook(path)
    return json.loads(path.read_text())["cells"][0]["outputs"]


def _stream(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text}


def test_a_figure_becomes_a_link_to_the_png_the_cell_saved(tmp_path, monkeypatch, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from plugin_lib.report import writer

    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path / "results"))
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    png = writer.save_figure(fig, "main_e2e", "local")["png"]
    plt.close(fig)
    printed = capsys.readouterr().out
    outputs = _strip_outputs(tmp_path, [
        _stream(["table saved\n", printed]),
        {"output_type": "execute_result", "execution_count": 1, "metadata": {},
         "data": {"image/png": "AAAA", "text/plain": "<Figure size 1259.73x320 with 3 Axes>"}},
    ])
    assert outputs[0]["text"] == "table saved\n"
    assert outputs[1]["data"]["text/markdown"] == "![main_e2e](../figures/main_e2e.png)"
    assert (tmp_path / "results" / "local" / "executed" / "../figures/main_e2e.png").resolve() == png.resolve()
    assert len(outputs) == 2 and "<Figure" not in json.dumps(outputs)


def test_a_figure_text_without_a_saved_figure_goes(tmp_path):
    outputs = _strip_outputs(tmp_path, [{"output_type": "display_data", "metadata": {},
                                         "data": {"text/plain": "<Figure size 1100x420 with 2 Axes>"}}])
    assert outputs == []


def test_streams_lose_progress_bars_tokenizer_chatter_and_the_ipywidgets_warning(tmp_path):
    warning = (".venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found. Please update "
               "jupyter and ipywidgets. See https://ipywidgets.readthedocs.io/en/stable/user_install.html\n"
               "  from .autonotebook import tqdm as notebook_tqdm\n")
    outputs = _strip_outputs(tmp_path, [
        _stream(warning, "stderr"),
        {"output_type": "execute_result", "execution_count": 1, "metadata": {}, "data": {"text/plain": "42"}},
        _stream("\rLoading weights:   0%|          | 0/272 [00:00<?, ?it/s]", "stderr"),
        _stream("\rLoading weights: 100%|██████████| 272/272 [00:00<00:00, 6658.52it/s]", "stderr"),
        _stream("\n", "stderr"),
        _stream("\rbase outputs:   6%|▋         | 1/16 [00:03<00:54,  3.65s/it]\x1b[A\n\n", "stderr"),
        _stream("\rwebnlg / smollm2:  70%|███████   | 14/20 [19:51<08:30, 85.09s/it]"
                "PTBTokenizer tokenized 5720 tokens at 45969.37 tokens per second.\n", "stderr"),
        _stream("Nov 23, 2026 4:14:12 PM edu.stanford.nlp.process.PTBLexer next\n"
                "WARNING: Untokenizable: ? (U+D83C, decimal: 55356)\n"
                "PTBTokenizer tokenized 9305 tokens at 26106.48 tokens per second.\n", "stderr"),
        _stream("UserWarning: CommonGen train: the older v1.0 release is used\n", "stderr"),
        _stream("best: 0.5\n\nscored 3 runs\n"),
    ])
    assert outputs[0]["data"] == {"text/plain": "42"}
    assert outputs[1:] == [_stream("UserWarning: CommonGen train: the older v1.0 release is used\n", "stderr"),
                           _stream("best: 0.5\n\nscored 3 runs\n")]


def test_the_environments_path_reads_as_venv_wherever_it_lies(tmp_path):
    """A shared PLUGIN_VENV outside the checkout leaves no machine path in a warning's text."""
    warning = f"{sys.prefix}/lib/python3.11/site-packages/x.py:1: FutureWarning: old\n"
    outputs = _strip_outputs(tmp_path, [{"output_type": "stream", "name": "stderr", "text": warning}])
    assert outputs[0]["text"] == ".venv/lib/python3.11/site-packages/x.py:1: FutureWarning: old\n"
