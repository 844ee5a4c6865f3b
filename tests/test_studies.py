"""The study registry (commands/studies.py) is the one list of notebooks (issue 75): every
notebook on disk is declared once; the report's sections, the orchestrator's notebooks,
gpu-check's and the grid's come from it; no module keeps a list of notebooks, report sections
or a study's units of its own, whatever form the names take; and a study's units take its
notebook's own parameters, with no defaults of their own."""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from plugin_lib.commands import document, studies
from plugin_lib.commands import gpu_check

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "plugin_lib"
REGISTRY = PACKAGE / "commands" / "studies.py"
STEM = re.compile(r"(?:^|/)\d\d_[a-z]{2,}")  # a notebook's file name, alone or in a path
PREFIX = re.compile(r"\d\d")  # the number --only takes
GLOB = re.compile(r"\[0-9\]\[0-9\]_|\d\d_\*|\*\.ipynb")  # a search of notebooks/ on disk


def test_every_notebook_on_disk_is_declared_once():
    on_disk = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert list(studies.NOTEBOOKS) == on_disk
    assert len(set(studies.NOTEBOOKS)) == len(studies.NOTEBOOKS)
    assert len({s.prefix for s in studies.STUDIES}) == len(studies.STUDIES)  # --only 07 names one study
    for study in studies.STUDIES:
        assert (study.units is None) == bool(study.in_notebook), study.notebook
        assert study.units is None or study.units.__module__ == "plugin_lib.experiments." + study.work.rsplit(".", 1)[0]
        assert study.title and study.results, study.notebook
    with pytest.raises(ValueError, match="declares its units or why"):
        studies.Study("99_x", "a title", ("x",), ())


def _code_files():
    return [p for p in PACKAGE.rglob("*.py") if p != REGISTRY] + sorted((ROOT / "scripts").glob("*.py")) \
        + sorted((ROOT / "benchmarks").glob("*.py"))


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_no_module_names_notebooks_or_report_sections_outside_the_registry():
    """A notebook's file name, a glob of notebooks/, two or more notebook numbers in one list,
    tuple, set or mapping, or a report section's title: each only in the registry. (A frozen
    rule names the one notebook its claim comes from, as a single number: allowed.)"""
    titles = {s.title for s in studies.STUDIES}
    found = []
    for path in _code_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT).as_posix()
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value
                if STEM.search(text) or GLOB.search(text) and "notebook" in where + text:
                    found.append(f"{where}:{node.lineno}: {text[:40]!r}")
                if text in titles:
                    found.append(f"{where}:{node.lineno}: the section title {text!r}")
            elements = (node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else
                        node.keys if isinstance(node, ast.Dict) else [])
            numbers = [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)
                       and PREFIX.fullmatch(e.value)]
            if len(numbers) >= 2:
                found.append(f"{where}:{node.lineno}: notebook numbers {numbers}")
    assert found == []


def test_no_module_calls_a_studys_units_but_the_registry():
    """A wave's units are a notebook's with other parameters (``studies.study_units``), not a
    second call of the study's function with arguments of its own."""
    names = {tuple(s.work.rsplit(".", 1)) for s in studies.STUDIES if s.work}
    calls = []
    for path in _code_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in names:
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.value.id}.{node.func.attr}")
    assert calls == []


@pytest.mark.parametrize("study", [s for s in studies.STUDIES if s.units], ids=lambda s: s.notebook)
def test_a_studys_units_take_its_notebooks_parameters_and_nothing_else(study):
    """Every keyword of the study's ``units`` is a parameter of its notebook, without a default:
    the value the grid plans with is the one the notebook runs with."""
    parameters = inspect.signature(study.units).parameters.values()
    keywords = [p for p in parameters if p.kind is p.KEYWORD_ONLY]
    assert keywords and all(p.default is inspect.Parameter.empty for p in keywords)
    assert {p.name for p in keywords} <= set(studies.notebook_parameters(study))
    assert [p.name for p in parameters if p.kind is not p.KEYWORD_ONLY] == ["profile", "notebook"]


def test_a_notebooks_parameter_reaches_its_units(monkeypatch):
    """Notebook 12's ks, as papermill's -p would set them, are the views its units run."""
    from plugin_lib.harness.profile import load_profile

    profile = load_profile("smoke")
    default = {u.model for u in studies.study_units("12_topk_logprobs", profile) if u.kind == "cache"}
    assert any("@top100-residual" in m for m in default)
    other = {u.model for u in studies.study_units("12_topk_logprobs", profile, ks=[7]) if u.kind == "cache"}
    assert any("@top7-residual" in m for m in other) and not any("@top100" in m for m in other)
    with pytest.raises(ValueError, match="has no parameter kz"):
        studies.study_units("12_topk_logprobs", profile, kz=[7])


def test_the_readers_take_the_registry(tmp_path, monkeypatch):
    """REPORT.md has one section per study, in its order; gpu-check runs its notebooks."""
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    from plugin_lib.harness.profile import load_profile

    text = document.report_text(load_profile("smoke"))
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert [h for h in headings if h in {s.title for s in studies.STUDIES}] == [s.title for s in studies.STUDIES]
    assert gpu_check.notebook_names() == list(studies.NOTEBOOKS)
    assert studies.data_groups(["09"]) == ["adidas", "nltk"] and studies.data_groups(["13"]) == []
