"""The README's example is executed, so it cannot go stale (x-transformers' habit)."""
import re

import pytest

from plugin_lib import config


def test_readme_example_runs(capsys):
    if config.data_dir() is None:
        pytest.skip("PLUGIN_DATA_DIR is not set: the README example reads the E2E data")
    readme = (config.REPO_ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "the README lost its Python example"
    exec(compile(blocks[0], "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "hyper-validation loss" in out and out.count("[") >= 2


def test_readme_states_the_two_setup_commands():
    readme = (config.REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert "bash run_all.sh" in readme and "bash run_tests.sh" in readme
    assert "bash run_tests.sh" in (config.REPO_ROOT / ".ci" / "run").read_text()
