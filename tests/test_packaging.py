"""`pip install .` gives a package that imports: every third-party module that plugin_lib
imports belongs to a distribution that pyproject.toml declares (a dependency or an extra), and
the lock (requirements.txt) pins a version inside each declared range."""
from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions

from packaging.requirements import Requirement

from plugin_lib.harness.profile import REPO_ROOT

PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _name(distribution: str) -> str:
    return distribution.lower().replace("_", "-")


def imported_modules() -> set[str]:
    modules = set()
    for path in (REPO_ROOT / "plugin_lib").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "plugin_lib"}


def test_every_imported_distribution_is_declared():
    declared = {_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    declared |= {_name(Requirement(r).name) for extra in PROJECT["optional-dependencies"].values() for r in extra}
    owners = packages_distributions()
    undeclared = {m: owners.get(m) for m in imported_modules()
                  if not {_name(d) for d in owners.get(m, [m])} & declared}
    assert not undeclared, f"plugin_lib imports these, and pyproject.toml declares no distribution of them: {undeclared}"


def test_the_lock_pins_versions_inside_the_declared_ranges():
    ranges = {_name(Requirement(r).name): Requirement(r).specifier for r in PROJECT["dependencies"]}
    lines = (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    assert pins
    for pin in pins:
        version = next(iter(pin.specifier)).version
        if _name(pin.name) in ranges:
            assert ranges[_name(pin.name)].contains(version), f"{pin} is outside pyproject's {ranges[_name(pin.name)]}"


def test_the_wheel_holds_every_file_of_the_package(tmp_path):
    """Issue 76: a built wheel lacked plugin_lib/report/preregistered_wave3_inputs.json, so an installed
    package could not judge wave 3. The wheel, built from the tracked files, holds exactly them."""
    import importlib.util
    import subprocess
    import zipfile

    tracked = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "pyproject.toml", "README.md", "LICENSE",
                              "plugin_lib"], capture_output=True, text=True, check=True).stdout.split()
    source = tmp_path / "source"
    for name in tracked:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((REPO_ROOT / name).read_bytes())
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w",
                            str(tmp_path / "wheel"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    packaged = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("plugin_lib/")}
    assert packaged == {n for n in tracked if n.startswith("plugin_lib/")}
