"""``plugin-repro`` (``python -m plugin_lib``): one subcommand per job the README shows, each
handing its arguments, --help included, to the job's own parser; exit statuses pass through."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def front_door(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plugin_lib", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_every_job_is_a_subcommand():
    listed = front_door("--help")
    assert listed.returncode == 0
    for command in ("run", "data", "preflight", "grid", "report", "confirmation", "stamp", "train", "generate",
                    "evaluate", "serve"):
        assert f" {command} " in listed.stdout, command


def test_a_subcommand_hands_its_arguments_and_help_to_the_jobs_own_parser():
    help_text = front_door("grid", "plan", "--help")
    assert help_text.returncode == 0 and "--profile" in help_text.stdout and "--summary" in help_text.stdout
    wrong = front_door("preflight", "--profile", "no-such-profile")
    assert wrong.returncode == 2 and "invalid choice: 'no-such-profile'" in wrong.stderr


def test_the_stamp_check_gives_the_modules_status():
    notebook = "notebooks/13_theorem1_convergence.ipynb"
    door = front_door("stamp", "--profile", "local", "--check", notebook)
    script = subprocess.run([sys.executable, "-m", "plugin_lib.commands.stamp", "--profile", "local", "--check", notebook],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert door.returncode == script.returncode and door.stderr == script.stderr


def test_another_checkouts_commands_are_refused_in_one_line(tmp_path):
    """Issue 76: with one environment for two clones, `plugin-repro run` in clone B ran clone A's
    code and rewrote A's report. In another checkout, the commands that read or write it refuse;
    the others warn."""
    other = tmp_path / "other-clone"
    (other / "plugin_lib").mkdir(parents=True)
    (other / "plugin_lib" / "__init__.py").write_text("")
    (other / "run_all.sh").write_text("")
    (other / "notebooks").mkdir()

    def call(*args):  # this checkout's plugin_lib, as an environment installed from it imports it
        return subprocess.run([sys.executable, "-P", "-c", "from plugin_lib.__main__ import main; main()", *args],
                              cwd=other / "notebooks", capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})

    refused = call("report", "--profile", "smoke")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert f"runs the plugin_lib of {ROOT}, not of the checkout you are in ({other})" in refused.stderr
    warned = call("train", "--help")
    assert warned.returncode == 0 and warned.stderr == ""  # --help: no warning
    warned = call("evaluate", "--plugin", str(tmp_path / "none"), "--data", str(tmp_path / "none.jsonl"))
    assert warned.returncode == 2 and warned.stderr.startswith("warning: plugin-repro: this command runs")
