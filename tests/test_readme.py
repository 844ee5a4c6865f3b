"""The README's example is executed, so it cannot go stale (x-transformers' habit)."""
import re

import pytest

from plugin_lib.data import load_dataset
from plugin_lib.harness.profile import REPO_ROOT


def test_readme_example_runs(capsys):
    try:
        load_dataset("e2e", "validation", rows=1)
    except FileNotFoundError:
        pytest.skip("no E2E data (data/ is empty, PLUGIN_DATA_DIR unset): the README example reads it")
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "the README lost its Python example"
    exec(compile(blocks[0], "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "hyper-validation loss" in out and out.count("[") >= 2


def test_readme_states_the_two_setup_commands():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert "bash run_all.sh" in readme and "bash run_tests.sh" in readme
    assert "bash run_tests.sh" in (REPO_ROOT / ".ci" / "run").read_text()


def test_readme_is_a_short_front_door():
    """Detail lives in docs/ and REPORT.md; the README links to them."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < 16_000
    for target in ("docs/architecture.md", "docs/data.md", "results/local/REPORT.md"):
        assert target in readme and (REPO_ROOT / target).exists(), target
