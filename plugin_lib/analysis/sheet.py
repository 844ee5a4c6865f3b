"""Material for running the paper's human side-by-side study yourself (Appendix "Human
Evaluation"): raters see the product attributes, the ground-truth description and two
outputs in random order, and pick the one closest to the ground truth.

``export_preference_sheet`` writes a self-contained HTML page to read and a CSV to fill in
(column ``choice``: ``left``, ``right`` or ``tie``). The CSV's ``key_left``/``key_right``
columns say which method is on which side: hide them from raters. ``tally_preference_sheet``
reads a filled-in CSV back into the statistics of ``preference``.
"""
from __future__ import annotations

import csv
import html
import io
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..data import ADIDAS_FIELDS, Example
from ..utils.io import atomic_write_text
from .preference import preference_summary

CSV_COLUMNS = ("item", "id", "attributes", "reference", "left", "right", "choice",
               "key_left", "key_right")
CHOICES = {"left", "right", "tie"}
INSTRUCTIONS = ("For each product, read the ground-truth description, then choose the output "
                "(left or right) that is closest to it. Record your choice as left, right or "
                "tie in the column 'choice' of the CSV sheet.")


@dataclass(frozen=True)
class SheetItem:
    """One item of the study: ``outputs`` maps each of the two method names to its text."""

    id: str
    attributes: Mapping[str, str]
    reference: str
    outputs: Mapping[str, str]


def sheet_items(examples: Sequence[Example],
                outputs_by_method: Mapping[str, Sequence[str]]) -> list[SheetItem]:
    """Items from dataset examples and two methods' outputs (one per example, same order).

    Attributes are the Adidas fields of ``meta`` (the source string for other datasets);
    the reference is the example's first one.
    """
    if len(outputs_by_method) != 2:
        raise ValueError(f"Need exactly two methods, got {list(outputs_by_method)}.")
    for method, outputs in outputs_by_method.items():
        if len(outputs) != len(examples):
            raise ValueError(f"{method}: {len(outputs)} outputs for {len(examples)} examples.")
    items = []
    for i, example in enumerate(examples):
        attributes = {key: example.meta[key] for key in ADIDAS_FIELDS if key in example.meta}
        items.append(SheetItem(
            id=example.id, attributes=attributes or {"source": example.source},
            reference=example.references[0],
            outputs={method: outputs[i] for method, outputs in outputs_by_method.items()}))
    return items


def _sides(items: Sequence[SheetItem], seed: int) -> list[tuple[str, str]]:
    """(left method, right method) per item: a seeded coin flip each."""
    rng = random.Random(seed)
    sides = []
    for item in items:
        methods = sorted(item.outputs)  # independent of the mapping's insertion order
        if len(methods) != 2:
            raise ValueError(f"Item {item.id} has {len(methods)} outputs; need exactly two.")
        sides.append(tuple(methods) if rng.random() < 0.5 else tuple(reversed(methods)))
    return sides


def _attributes_text(attributes: Mapping[str, str]) -> str:
    return "; ".join(f"{key}: {value}" for key, value in attributes.items())


def _csv_text(items: Sequence[SheetItem], sides: list[tuple[str, str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for number, (item, (left, right)) in enumerate(zip(items, sides), start=1):
        writer.writerow([number, item.id, _attributes_text(item.attributes), item.reference,
                         item.outputs[left], item.outputs[right], "", left, right])
    return buffer.getvalue()


HTML_STYLE = """
body { font-family: sans-serif; max-width: 70em; margin: 2em auto; line-height: 1.4; }
.item { border-top: 2px solid #888; padding: 1em 0; }
.text { white-space: pre-wrap; background: #f4f4f4; padding: 0.6em; }
.pair { display: flex; gap: 1em; }
.pair > div { flex: 1; }
"""


def _html_item(number: int, item: SheetItem, left: str, right: str) -> str:
    e = html.escape
    attributes = "".join(f"<li>{e(str(key))}: {e(str(value))}</li>"
                         for key, value in item.attributes.items())
    return (f'<div class="item"><h2>Item {number}</h2><ul>{attributes}</ul>'
            f'<h3>Ground truth</h3><div class="text">{e(item.reference)}</div>'
            f'<div class="pair"><div><h3>Left</h3><div class="text">{e(item.outputs[left])}'
            f'</div></div><div><h3>Right</h3><div class="text">{e(item.outputs[right])}'
            f"</div></div></div></div>")


def _html_page(items: Sequence[SheetItem], sides: list[tuple[str, str]]) -> str:
    body = "\n".join(_html_item(number, item, left, right)
                     for number, (item, (left, right)) in enumerate(zip(items, sides), start=1))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>Side-by-side evaluation</title><style>{HTML_STYLE}</style></head>"
            f"<body><h1>Side-by-side evaluation</h1><p>{html.escape(INSTRUCTIONS)}</p>\n"
            f"{body}\n</body></html>\n")


def export_preference_sheet(items: Sequence[SheetItem], path_html: str | Path,
                            path_csv: str | Path, seed: int) -> dict[str, Path]:
    """Write the rater page (HTML) and sheet (CSV), sides shuffled with ``seed``.

    Item numbers are 1-based positions in ``items`` and are shared by both files.
    """
    sides = _sides(items, seed)
    return {"html": atomic_write_text(path_html, _html_page(items, sides)),
            "csv": atomic_write_text(path_csv, _csv_text(items, sides))}


def tally_preference_sheet(path_csv: str | Path, method: str, seed: int = 0) -> dict[str, float]:
    """:func:`preference_summary` for ``method`` from a filled-in sheet; blank choices skipped."""
    with open(path_csv, newline="", encoding="utf-8") as f:
        rows = [row for row in csv.DictReader(f) if row["choice"].strip()]
    outcomes = []
    for row in rows:
        choice = row["choice"].strip().lower()
        if choice not in CHOICES:
            raise ValueError(f"Item {row['item']}: choice {row['choice']!r} is not one of "
                             f"{sorted(CHOICES)}.")
        if method not in (row["key_left"], row["key_right"]):
            raise ValueError(f"Item {row['item']} does not compare {method!r}.")
        outcomes.append(0.5 if choice == "tie" else float(row[f"key_{choice}"] == method))
    return preference_summary(outcomes, seed=seed)
