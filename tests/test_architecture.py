"""The package's shape: layered subpackages whose imports point one way, no cycles, no
top-level modules beside them, and a wheel that carries every data file."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "plugin_lib"

# Lower layers never import higher ones; a package may import itself and anything below it.
LAYERS = {
    "utils": 0, "paper": 0,
    "core": 1,
    "data": 2, "metrics": 2,
    "analysis": 3,
    "harness": 4,
    "report": 5, "serving": 5,
    "experiments": 6,
    "commands": 7,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every plugin_lib module ``path`` imports, at any depth (function-local imports too)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("plugin_lib")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("plugin_lib"):
                # "from pkg import sub" imports the submodule; "from mod import name" the module.
                found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in _modules() else target
                          for a in node.names}
    return found


def _modules() -> dict[str, Path]:
    """The library's modules. A ``__main__`` is an entry point, above every layer: it composes
    them (the grid's command collects each notebook's units from ``plugin_lib.experiments``), and
    nothing imports it (``test_nothing_imports_an_entry_point``)."""
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py"}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {r for r in (_resolve(i, modules) for i in _imports(p)) if r and r != m}
            for m, p in modules.items()}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_no_top_level_module_beside_the_subpackages():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))  # the front door
    assert loose == []
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LAYERS)


def test_imports_point_down_the_layers():
    upward = []
    for module, targets in _graph().items():
        if module == "plugin_lib":
            continue  # the public facade re-exports from below, lazily
        for target in targets:
            if target == "plugin_lib":
                upward.append(f"{module} imports the package facade")
                continue
            mine, theirs = _layer(module), _layer(target)
            if mine != theirs and LAYERS[theirs] >= LAYERS[mine]:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_nothing_imports_an_entry_point():
    importing = [f"{_module_name(p)} -> {i}" for p in PACKAGE.rglob("*.py") for i in _imports(p)
                 if i.endswith("__main__")]
    assert importing == []


def test_core_imports_only_core():
    outside = [f"{m} -> {t}" for m, ts in _graph().items() if _layer(m) == "core"
               for t in ts if _layer(t) != "core"]
    assert outside == []


def test_experiments_do_not_import_each_other():
    crossing = [f"{m} -> {t}" for m, ts in _graph().items() if _layer(m) == "experiments"
                for t in ts if _layer(t) == "experiments" and t != "plugin_lib.experiments"]
    assert crossing == []


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_checker_sees_an_upward_import(tmp_path):
    """The rule above is live: a core module importing the harness is caught."""
    fake = tmp_path / "plugin_lib" / "core"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("from ..harness import runner\ndef f():\n    import plugin_lib.report.claims\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "plugin_lib"
    try:
        assert _imports(fake / "bad.py") == {"plugin_lib.harness", "plugin_lib.report.claims"}
    finally:
        PACKAGE = saved


def test_public_api_names_resolve():
    import plugin_lib

    for name in plugin_lib.__all__:
        assert getattr(plugin_lib, name) is not None, name


# Installed only in an environment of their own (scripts/bootstrap_vllm.sh): a module that imports
# them is found by its file here, not imported.
ELSEWHERE = ("vllm",)


def _named_object(dotted: str):
    """The module, or attribute of one, that ``dotted`` names (ImportError/AttributeError if none)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as err:
            if err.name.split(".")[0] in ELSEWHERE and importlib.util.find_spec(".".join(parts[:i])):
                return ".".join(parts[:i])
            if not dotted.startswith(err.name):  # a missing dependency, not a missing name
                raise
            continue
        for attr in parts[i:]:
            found = getattr(found, attr)
        return found


def test_every_dotted_name_the_package_mentions_resolves():
    # Messages tell users where to look (plugin_lib.core.reweighter.make_reweighter): a module
    # renamed since must not leave them pointing nowhere.
    mentioned = {name for path in PACKAGE.rglob("*.py")
                 for name in re.findall(r"plugin_lib(?:\.\w+)+", path.read_text(encoding="utf-8"))}
    assert "plugin_lib.make_reweighter" in mentioned
    for name in sorted(mentioned):
        assert _named_object(name) is not None, name


@pytest.mark.slow
def test_wheel_installs_and_carries_every_data_file(tmp_path):
    """Build the wheel, install it into a fresh environment, and read every packaged file."""
    root = PACKAGE.parent
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(root)], check=True, env=env)
    (wheel,) = (tmp_path / "dist").glob("plugin_repro-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(tmp_path / "site"), str(wheel)], check=True, env=env)
    check = (
        "import plugin_lib, pathlib\n"
        "from plugin_lib import paper\n"
        "from plugin_lib.harness import profile\n"
        "assert 'site' in plugin_lib.__file__, plugin_lib.__file__\n"
        "for name in paper.TABLES: assert len(paper.table(name)) > 0, name\n"
        "for name in profile.profile_names(): profile.load_profile(name)\n"
        "from plugin_lib.data import integrity\n"
        "assert len(integrity.known_checksums()) > 100\n"
        "print('ok')\n"
    )
    # The installed copy comes first on the path, ahead of this checkout's editable install.
    out = subprocess.run([sys.executable, "-c", check], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env={**env, "PYTHONPATH": str(tmp_path / "site")})
    assert out.stdout.strip() == "ok"
