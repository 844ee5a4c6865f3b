"""``plugin-repro gpu-check`` on this CPU: the same steps as on a GPU, on the small twins
(``paper-twin``). On a GPU it runs the full-size twins (``paper-twin-gpu``); docs/gpu.md has
what a lent H200 gave. twin: says nothing about the paper's numbers."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugin_lib.commands import gpu_check
from plugin_lib.harness import models
from plugin_lib.harness.profile import load_profile

import real_data

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "check"
    env = {**os.environ, "PLUGIN_RESULTS_DIR": str(tmp_path / "store"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "plugin_lib.commands.gpu_check", "--out", str(out), *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    return done, out


def steps(out: Path) -> dict[str, dict]:
    with open(out / "steps.csv", encoding="utf-8", newline="") as f:
        return {row["step"]: row for row in csv.DictReader(f)}


def test_the_gpu_profile_is_paper_twin_on_the_full_size_twins():
    small, full, paper = load_profile("paper-twin"), load_profile("paper-twin-gpu"), load_profile("paper")
    assert full.base_models == tuple(models.model_spec(m)["twin"] for m in paper.base_models)
    assert [f"{m}-small" for m in full.base_models] == list(small.base_models)
    assert (full.rows, full.seeds, full.grid, full.training, full.decoding) == (
        small.rows, small.seeds, small.grid, small.training, small.decoding)  # smoke-sized, as paper-twin
    assert full.ablations.model == "gpt2-medium-twin" and full.shift.model == "llama-3.1-8b-twin"
    assert full.shift.finetune.lora_rank == paper.shift.finetune.lora_rank
    assert full.cache_layout == paper.cache_layout == "auto"  # compact on a GPU, as the paper profile


@pytest.mark.slow
def test_on_a_cpu_it_runs_the_notebooks_on_the_small_twins_and_writes_the_record(tmp_path):
    real_data.require()  # the data check of the profile reads every dataset
    done, out = run_check(tmp_path, "--only", "13", "--skip", "tests", "bench", "rates", "mps")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "profile paper-twin, 1 notebooks" in done.stdout
    table = steps(out)
    assert list(table) == ["data", "notebook 13_theorem1_convergence"]
    assert {row["status"] for row in table.values()} == {"passed"}
    assert float(table["notebook 13_theorem1_convergence"]["seconds"]) > 0
    executed = json.loads((out / "notebooks" / "13_theorem1_convergence.ipynb").read_text())
    code = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert code and all(c.get("execution_count") for c in code)  # every cell ran
    assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", []))
    env = json.loads((out / "environment.json").read_text())
    assert env["profile"] == "paper-twin" and "gpu" not in env and env["java"]["path"]
    assert "2 of 2 steps passed" in (out / "SUMMARY.md").read_text()
    assert not list((out / "notebooks").glob(".*running*"))  # nothing half-written left behind


@pytest.mark.slow
def test_past_the_deadline_nothing_starts_and_the_check_fails(tmp_path):
    real_data.require()
    done, out = run_check(tmp_path, "--only", "13", "--skip", "tests", "bench", "--deadline-s", "0.001")
    assert done.returncode == 1
    table = steps(out)
    assert table["notebook 13_theorem1_convergence"]["status"] == "not run"
    assert table["notebook 13_theorem1_convergence"]["note"] == "past the deadline"
    assert not (out / "notebooks" / "13_theorem1_convergence.ipynb").exists()


def test_an_unknown_notebook_is_refused_with_the_list():
    with pytest.raises(SystemExit, match="--only 99 matches no notebook; the notebooks: 00_dataset"):
        gpu_check.notebook_names(["99"])
    assert gpu_check.notebook_names(["01", "13"]) == ["01_table1_e2e", "13_theorem1_convergence"]


def test_a_failed_notebook_is_named_by_its_last_error(tmp_path):
    log = tmp_path / "nb.log"
    log.write_text("Executing cell 3\nTraceback (most recent call last):\n  File x\n"
                   "RuntimeError: No working Java: no java on PATH\nEnding Cell 3\n")
    assert gpu_check._last_error(log) == "RuntimeError: No working Java: no java on PATH"


@pytest.mark.parametrize("name, label", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100"), ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla T4", "t4"), ("NVIDIA L4", "l4"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
])
def test_a_gpu_folder_is_named_by_the_model_not_its_memory(name, label):
    # results/gpu/<label>_<date>/: an H100's name ends in its memory's kind (HBM3), which named the folder
    assert gpu_check.gpu_label(name) == label


def test_a_step_stopped_at_its_deadline_takes_the_processes_it_started_with_it(tmp_path):
    """bench_mps.py and the preflight start processes of their own: at the deadline they stop too,
    not only the step (they would hold the GPU through the steps after)."""
    import time

    pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; "
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(120)")
    check = gpu_check.Checklist(tmp_path, "paper-twin", False, 1, time.monotonic() + 3)
    result = check.command("sleeper", [sys.executable, "-c", script], "sleeper.log")
    assert (result.status, result.note) == ("failed", "stopped at the deadline")
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # an orphan is reaped by init: gone, or a zombie meanwhile
        try:
            state = Path(f"/proc/{child}/stat").read_text().split(")")[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the step's child {child} still runs after the deadline")
