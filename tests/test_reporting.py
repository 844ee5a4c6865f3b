"""Reporting: tables and figures land under results/<profile>/ in every format."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from plugin_lib.report import writer  # noqa: E402


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    return tmp_path


def test_save_table_writes_csv_markdown_and_latex(results_dir):
    df = pd.DataFrame({"dataset": ["e2e", "adidas"], "rows": pd.array([4299, None], "Int64"),
                       "note": ["matches", "a_b & c"]})
    paths = writer.save_table(df, "stats", "smoke", caption="Dataset statistics")
    folder = results_dir / "smoke" / "tables"
    assert paths == {fmt: folder / f"stats.{fmt}" for fmt in ("csv", "md", "tex")}
    assert pd.read_csv(paths["csv"])["rows"].tolist()[0] == 4299
    markdown = paths["md"].read_text()
    assert "| e2e" in markdown and "<NA>" not in markdown
    latex = paths["tex"].read_text()
    for piece in (r"\toprule", r"\bottomrule", r"\caption{Dataset statistics}",
                  r"\label{tab:stats}", r"a\_b \& c"):
        assert piece in latex
    assert not list(folder.glob("*.tmp"))


def test_save_table_keeps_a_named_index(results_dir):
    df = pd.DataFrame({"bleu": [0.5]}, index=pd.Index(["plugin"], name="method"))
    paths = writer.save_table(df, "scores", "local")
    assert paths["csv"].read_text().splitlines()[0] == "method,bleu"


def test_save_figure_writes_png_and_pdf(results_dir):
    writer.set_style()
    fig, ax = plt.subplots()
    ax.bar(["a", "b"], [1, 2])
    paths = writer.save_figure(fig, "bars", "smoke")
    plt.close(fig)
    assert paths["png"].read_bytes().startswith(b"\x89PNG")
    assert paths["pdf"].read_bytes().startswith(b"%PDF")
    assert paths["png"].parent == results_dir / "smoke" / "figures"
    assert not list(paths["png"].parent.glob("*.tmp"))
