"""What the orchestrator checks and prints: the stamps (commands/stamp.py: a notebook's stamp
hashes its inputs and nothing of the environment; the code version is the package's content,
not its formatting; a damaged stored record stops the stamps, naming the cheapest mend) and a
failed notebook's error (commands/notebook_files.py: the line it is reported by)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_checkout import ROOT, notebook, run_stamp


def test_stamp_depends_on_inputs_not_on_the_environment(tmp_path, monkeypatch):
    rs = run_stamp()
    nb = tmp_path / "00_x.ipynb"
    nb.write_text(notebook("print(1)"))
    first = rs.stamp(nb, "smoke")
    for name, value in [("HOME", str(tmp_path)), ("PLUGIN_DATA_DIR", "/elsewhere"),
                        ("PLUGIN_RESULTS_DIR", "/other"), ("HOSTNAME", "another-machine")]:
        monkeypatch.setenv(name, value)
    os.utime(nb, (0, 0))
    assert rs.stamp(nb, "smoke") == first
    assert rs.stamp(nb, "local") != first
    assert rs.stamp(nb, "smoke", {"seeds": "[1]"}) != first
    nb.write_text(notebook("print(2)"))
    assert rs.stamp(nb, "smoke") != first
    # An optional data file changes splits: present, it changes the stamp.
    data = tmp_path / "data"
    monkeypatch.setenv("PLUGIN_DATA_DIR", str(data))
    (data / "commongen" / "hf_format").mkdir(parents=True)
    without = rs.stamp(nb, "smoke")
    (data / "commongen" / "hf_format" / "commongen.train.jsonl").write_text("{}\n")
    assert rs.stamp(nb, "smoke") != without


def test_code_version_is_the_package_content(tmp_path):
    rs = run_stamp()
    (tmp_path / "plugin_lib" / "harness").mkdir(parents=True)
    code = tmp_path / "plugin_lib" / "harness" / "a.py"
    code.write_text("x = 1\n")
    (tmp_path / "plugin_lib" / "harness" / "p.yaml").write_text("a: 1\n")
    first = rs.code_version(tmp_path)
    os.utime(code, (0, 0))
    (tmp_path / "plugin_lib" / "__pycache__").mkdir()
    (tmp_path / "plugin_lib" / "__pycache__" / "a.py").write_text("compiled\n")
    (tmp_path / "plugin_lib" / "notes.md").write_text("not code\n")
    assert rs.code_version(tmp_path) == first
    code.write_text("x = 1\r\n")  # a Windows checkout
    assert rs.code_version(tmp_path) == first
    code.write_text('"""A docstring."""\n# a comment\nx = (\n    1)\n')  # no change to what runs
    assert rs.code_version(tmp_path) == first
    code.write_text("x = 2\n")
    assert rs.code_version(tmp_path) != first
    code.write_text("x = 1\n")
    (tmp_path / "plugin_lib" / "harness" / "p.yaml").write_text("a: 2\n")
    assert rs.code_version(tmp_path) != first


def _notebook_error():
    from plugin_lib.commands.notebook_files import error_lines

    return error_lines


CELL_LOG = """Executing Cell 2---------------------------------------
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/papermill/execute.py", line 251, in raise_for_execution_errors
    raise error
papermill.exceptions.PapermillExecutionError: 
---------------------------------------------------------------------------
Exception encountered at "In [2]":
---------------------------------------------------------------------------
\x1b[0;31mMissingDataError\x1b[0m                          Traceback (most recent call last)
Cell In[2], line 3
      1 from plugin_lib.data import load_dataset
----> 3 load_dataset("e2e", "test")
""" + "\n".join(f"    {i} frame line" for i in range(30)) + """

File ~/repo/plugin_lib/data/datasets.py:265, in _missing(relpath)
--> 265 raise MissingDataError(
    266     f"Missing {relpath} ..."

plugin_lib.data.datasets.MissingDataError: Missing e2e_cleaned/test-fixed.csv in PLUGIN_DATA_DIR=/x.
Download it from https://example.org/e2e; save it as <PLUGIN_DATA_DIR>/e2e_cleaned/test-fixed.csv.

"""


def test_notebook_error_is_the_final_exception_of_the_cell():
    assert _notebook_error()(CELL_LOG) == [
        "plugin_lib.data.datasets.MissingDataError: Missing e2e_cleaned/test-fixed.csv in PLUGIN_DATA_DIR=/x.",
        "Download it from https://example.org/e2e; save it as <PLUGIN_DATA_DIR>/e2e_cleaned/test-fixed.csv.",
    ]


def test_notebook_error_outside_a_cell_is_the_last_python_exception():
    log = ("Input Notebook:  x.ipynb\nTraceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n"
           "    main()\nnbclient.exceptions.DeadKernelError: Kernel died\n")
    assert _notebook_error()(log) == ["nbclient.exceptions.DeadKernelError: Kernel died"]
    assert _notebook_error()("just\nsome\nlines\n") == ["just", "some", "lines"]


def test_a_damaged_stored_record_stops_the_stamps_naming_it_and_the_cheapest_mend(tmp_path, monkeypatch, capsys):
    """A truncated record would let a matching stamp skip its notebook: the stamp step reads every
    record first and stops (exit 4, not run_all.sh's 3 for a held profile), naming the file; a
    committed one is restored from git first."""
    rs = run_stamp()
    monkeypatch.setenv("PLUGIN_RESULTS_DIR", str(tmp_path))
    runs = tmp_path / "smoke" / "runs" / "e2e" / "base"
    runs.mkdir(parents=True)
    (runs / "Plugin-seed0.json").write_text('{"seed": 0, "metrics": {}}')
    (runs / "Plugin-seed1.json").write_text('{"seed": 1, "metri')  # truncated
    (runs / ".Plugin-seed2.json.host~1.tmp").write_text('{"se')  # a temporary: not a record
    assert rs.damaged_records("smoke") == [runs / "Plugin-seed1.json"]
    nb = tmp_path / "00_x.ipynb"
    nb.write_text(notebook("print(1)"))
    assert rs.main(["--profile", "smoke", str(nb)]) == 4
    err = capsys.readouterr().err
    assert "Plugin-seed1.json" in err and "delete" in err and "recomputes" in err
    committed = ROOT / "results" / "local" / "runs" / "e2e" / "smollm2-135m-instruct" / "BDPL+Plugin-seed0.json"
    assert rs.mend_advice([committed]).startswith("restore the committed record(s) with `git checkout -- results/local/")


def test_a_notebook_is_named_by_its_file_name_or_prefix_and_an_unknown_one_is_refused_at_once(tmp_path):
    rs = run_stamp()
    own = tmp_path / "mine.ipynb"
    own.write_text(notebook("print(1)"))
    files = rs.notebook_files(["15", "13_theorem1_convergence", str(own)])
    assert [Path(f).name for f in files] == ["15_proxy_tuning.ipynb", "13_theorem1_convergence.ipynb", "mine.ipynb"]
    assert all(Path(f).is_file() for f in files)
    assert len(rs.notebook_files([])) == 16  # --check without names: every notebook
    with pytest.raises(ValueError, match="99 is neither a notebook file nor the start of a notebook's name; the "
                                         "notebooks: 00_dataset_statistics"):
        rs.notebook_files(["99"])
    refused = subprocess.run([sys.executable, "-m", "plugin_lib.commands.stamp", "--profile", "local", "--check", "99"],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert refused.returncode == 2 and "99 is neither a notebook file" in refused.stderr
    assert "Traceback" not in refused.stderr  # it was a FileNotFoundError, after a minute of checking records
