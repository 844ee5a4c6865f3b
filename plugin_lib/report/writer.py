"""The one writer of tables and figures, atomic, under ``results/<profile>/``.

Tables go to ``tables/<name>.{csv,md,tex}``, figures to ``figures/<name>.{png,pdf}``, and a part
a notebook ran but skipped (an optional server missing) to ``skipped/<name>.json``, which the
report shows in place of the results; a table or figure of that name replaces the record.
"""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib
import pandas as pd
import seaborn as sns

from ..harness.machine import results_dir
from ..harness.profile import REPO_ROOT, Profile
from ..utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text

FIGURE_DPI = 200


def set_style() -> None:
    """The one plotting style of all notebooks."""
    sns.set_theme(context="paper", style="whitegrid", palette="colorblind", font_scale=1.2)
    matplotlib.rcParams["figure.dpi"] = 100


def _keeps_index(df: pd.DataFrame) -> bool:
    """Write the index only when it carries information (not a plain 0..n-1 range)."""
    return not isinstance(df.index, pd.RangeIndex) or df.index.name is not None


def _markdown(df: pd.DataFrame, index: bool) -> str:
    # tabulate prints pandas' NA as "<NA>"; as None it becomes the missing-value mark.
    cells = df.astype(object).where(df.notna(), None)
    return cells.to_markdown(index=index, missingval="--")


def save_table(df: pd.DataFrame, name: str, profile: Profile | str, caption: str = "", *,
               markdown: str | None = None, latex: str | None = None) -> dict[str, Path]:
    """Write ``df`` as CSV (the numbers), Markdown and booktabs LaTeX; returns the paths by
    format. ``markdown`` and ``latex`` replace the plain renderings (formatted cells)."""
    folder = results_dir(profile) / "tables"
    index = _keeps_index(df)
    if latex is None:
        latex = df.to_latex(index=index, caption=caption or None, label=f"tab:{name}", na_rep="--", escape=True)
    if markdown is None:
        markdown = _markdown(df, index) + "\n"
    _clear_skip(name, profile)
    return {
        "csv": atomic_write_text(folder / f"{name}.csv", df.to_csv(index=index)),
        "md": atomic_write_text(folder / f"{name}.md", markdown),
        "tex": atomic_write_text(folder / f"{name}.tex", latex),
    }


def save_figure(fig, name: str, profile: Profile | str) -> dict[str, Path]:
    """Write a matplotlib figure as PNG (200 dpi) and PDF; returns the paths by format. Prints
    ``figure: PATH`` (the PNG, from the repository's root where it lies there), which
    ``commands.notebook_files.strip_notebook`` turns into a link in the executed notebook."""
    folder = results_dir(profile) / "figures"
    paths = {}
    for fmt in ("png", "pdf"):
        buffer = io.BytesIO()
        # No creation date in the PDF, so that the same figure gives the same bytes.
        metadata = {"CreationDate": None} if fmt == "pdf" else None
        fig.savefig(buffer, format=fmt, dpi=FIGURE_DPI, bbox_inches="tight", metadata=metadata)
        paths[fmt] = atomic_write_bytes(folder / f"{name}.{fmt}", buffer.getvalue())
    _clear_skip(name, profile)
    png = paths["png"].resolve()
    print(f"figure: {png.relative_to(REPO_ROOT) if png.is_relative_to(REPO_ROOT) else png}")
    return paths


def _skip_path(name: str, profile: Profile | str) -> Path:
    return results_dir(profile) / "skipped" / f"{name}.json"


def save_skip(name: str, profile: Profile | str, reason: str) -> Path:
    """Record that the notebook ran but skipped what would have written ``name``, and why."""
    return atomic_write_json(_skip_path(name, profile), {"name": name, "reason": reason})


def _clear_skip(name: str, profile: Profile | str) -> None:
    _skip_path(name, profile).unlink(missing_ok=True)  # the results are there now


def metric_bars(frame: pd.DataFrame, metrics=("BLEU", "ROUGE-L", "METEOR"), title: str = ""):
    """Bars of the mean per method (error bars: std over seeds), one panel per metric."""
    long = frame.melt(id_vars=["model", "method", "seed"], value_vars=list(metrics), var_name="metric")
    grid = sns.catplot(data=long, x="method", y="value", col="metric", row="model", kind="bar",
                       errorbar="sd", sharey=False, height=3.2, aspect=1.3, color=sns.color_palette()[0])
    grid.set_xticklabels(rotation=35, ha="right")
    return finish_grid(grid, title)


def finish_grid(grid, title: str = ""):
    """A seaborn facet grid's shared finish: "row | column" panel titles, no axis labels, the
    title above, closed (notebooks show the returned figure once)."""
    import matplotlib.pyplot as plt

    grid.set_titles("{row_name} | {col_name}")
    grid.set_axis_labels("", "")
    if title:
        grid.figure.suptitle(title, y=1.03)
    plt.close(grid.figure)
    return grid.figure
