"""The numbered notebooks' shape: a Colab cell first, a papermill `parameters` cell with the
profile, no function definitions (computation lives in plugin_lib), and a README Colab link."""
import ast
import json
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def code_cells(path: Path) -> list[dict]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [c for c in cells if c["cell_type"] == "code"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def test_every_numbered_notebook_is_found():
    assert len(NOTEBOOKS) == 16


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_colab_cell_comes_first_and_is_identical(path):
    first = code_cells(path)[0]
    assert "colab" in first["metadata"].get("tags", [])
    assert source(first) == source(code_cells(NOTEBOOKS[0])[0])


def test_colab_cell_does_nothing_outside_colab():
    cwd, path = os.getcwd(), list(sys.path)
    exec(source(code_cells(NOTEBOOKS[0])[0]), {})
    assert os.getcwd() == cwd and sys.path == path


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell_names_the_profile(path):
    cells = code_cells(path)
    tagged = [c for c in cells if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) == 1
    assert re.search(r'^profile = "(local|smoke|paper)"', source(tagged[0]), re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs_for_a_python3_kernel(path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    assert all(not c["outputs"] and c["execution_count"] is None for c in code_cells(path))


@pytest.mark.parametrize("path, call", [
    ("05_table5_bdpl_wrapper", "table5.run_table5("), ("11_table8_lora", "table8.run_table8("),
    ("12_topk_logprobs", "runner.run_table("), ("13_theorem1_convergence", "theorem1."),
    ("14_api_model", "api.run_study("), ("15_proxy_tuning", "proxy.run_proxy("),
])
def test_notebook_calls_into_plugin_lib(path, call):
    assert call in "".join(source(c) for c in code_cells(ROOT / "notebooks" / f"{path}.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_function_or_class_definitions(path):
    for cell in code_cells(path):
        tree = ast.parse(source(cell))
        defined = [n for n in ast.walk(tree)
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Lambda))]
        assert not defined, f"{path.name}: move definitions into plugin_lib"


def test_the_readme_lists_every_notebook_and_docs_colab_opens_each_in_colab():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    colab = (ROOT / "docs" / "colab.md").read_text(encoding="utf-8")
    clone_url = re.search(r'"(https://github\.com/[^"]+)"', source(code_cells(NOTEBOOKS[0])[0]))
    repo = clone_url.group(1).removeprefix("https://github.com/")
    assert "(docs/colab.md)" in readme
    for path in NOTEBOOKS:
        assert f"(notebooks/{path.name})" in readme, f"README does not list {path.name}"
        link = f"https://colab.research.google.com/github/{repo}/blob/main/notebooks/{path.name}"
        assert link in colab, f"docs/colab.md lacks the Colab link of {path.name}"


def _without_parameters(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [source(c) for c in cells if "parameters" not in c["metadata"].get("tags", [])
            and c["cell_type"] == "code"]


def test_main_table_notebooks_differ_only_in_their_parameters():
    """Notebooks 01-04 are one notebook run on four datasets: only the parameters cell differs."""
    main = [p for p in NOTEBOOKS if p.name[:2] in ("01", "02", "03", "04")]
    assert len(main) == 4
    first = _without_parameters(main[0])
    for path in main[1:]:
        assert _without_parameters(path) == first, f"{path.name} differs from {main[0].name} outside its parameters"
    datasets = {re.search(r'^dataset = "(\w+)"', source(c), re.M).group(1)
                for p in main for c in code_cells(p) if "parameters" in c["metadata"].get("tags", [])}
    assert datasets == {"e2e", "webnlg", "commongen", "adidas"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_one_profile_object(path):
    """The parameter ``profile`` is turned into the Profile once; no second name for it."""
    text = "".join(source(c) for c in code_cells(path))
    assert "profile = load_profile(profile" in text
    assert not re.search(r"\bprof\b", text)
