"""The conda description and the pip requirements must not drift apart."""
import re

import yaml

from plugin_lib.harness.profile import REPO_ROOT


def _requirements() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_environment_yml_pip_section_matches_requirements():
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    pins = {}
    for item in pip:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s]+)", item)
        if match:
            pins[match[1].lower().replace("_", "-")] = match[2]
    torch_pin = pins.pop("torch")
    assert pins == _requirements()
    bootstrap = (REPO_ROOT / "scripts" / "bootstrap_env.sh").read_text()
    assert f"torch=={torch_pin}" in bootstrap
    assert any(str(d).startswith("python=") for d in env["dependencies"])
