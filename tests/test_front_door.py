"""``plugin-repro`` (``python -m plugin_lib``): one subcommand per job the README shows, each
handing its arguments, --help included, to the job's own parser; exit statuses pass through."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_each_listed_command_reads_as_one_flowing_paragraph():
    """A listing's row is the command's first paragraph on one line where the terminal is wide
    enough: typer's rich listing kept the docstring's line breaks, which left ragged rows."""
    import inspect

    import typer

    from plugin_lib.__main__ import app
    from plugin_lib.serving import cli

    front = typer.main.get_command(app)
    for program, path, listing in (("plugin_lib", (), front), ("plugin_lib", ("data",), front.commands["data"]),
                                   ("plugin_lib", ("grid",), front.commands["grid"]),
                                   ("plugin_lib.serving.cli", (), typer.main.get_command(cli.app))):
        shown = subprocess.run([sys.executable, "-m", program, *path, "--help"], capture_output=True, text=True,
                               cwd=ROOT, timeout=300, env={**os.environ, "COLUMNS": "1000"}).stdout.splitlines()
        for name, command in listing.commands.items():
            first = " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
            assert any(f" {name} " in line and first in line for line in shown), (program, path, name, first)


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


# ---------------------------------------------------------------- every door opens at once

# What a command's work imports and its --help or a usage error must not wait for (issue 75).
HEAVY = ("torch", "transformers", "peft", "numpy", "pandas", "scipy", "matplotlib", "nltk", "ray", "submitit",
         "papermill", "nbclient", "fastapi", "uvicorn", "plugin_lib.core", "plugin_lib.harness.models",
         "plugin_lib.harness.grid.units", "plugin_lib.harness.planning.preflight", "plugin_lib.metrics", "plugin_lib.experiments",
         "plugin_lib.commands.studies", "plugin_lib.commands.document", "plugin_lib.report.budget")

# The front door in this process, then the heavy modules it imported, as the last line.
PROBE = """
import json, sys
from plugin_lib.__main__ import main
sys.argv = ["plugin-repro", *sys.argv[1:]]
try:
    main()
    status = 0
except SystemExit as end:
    status = end.code if isinstance(end.code, int) else int(end.code is not None)
heavy = sorted(h for h in {heavy!r} if any(m == h or m.startswith(h + ".") for m in sys.modules))
print("\\n" + json.dumps({{"status": status, "heavy": heavy}}))
""".format(heavy=HEAVY)

HELP = ["run", "data fetch", "data check", "preflight", "grid plan", "grid run", "report", "report budget",
        "report rows", "report controls", "confirmation",
        "confirmation status", "confirmation wave2", "confirmation wave2 margins", "confirmation wave3",
        "confirmation wave4 judge", "stamp", "gpu-check", "train", "generate", "evaluate", "serve"]
# A usage error and what its one message names.
USAGE_ERRORS = [
    ("run --profile no-such-profile", "no-such-profile"), ("run --bogus", "--bogus"),
    ("data fetch --bogus", "--bogus"), ("data check --profile no-such-profile", "no-such-profile"),
    ("preflight", "--profile"), ("preflight --profile no-such-profile", "no-such-profile"),
    ("preflight --profile local --gpu no-such-gpu", "no-such-gpu"),
    ("preflight --profile local --gpu-memory-gb", "--gpu-memory-gb"),
    ("grid plan", "--profile"), ("grid plan --profile no-such-profile", "no-such-profile"),
    ("grid plan --profile local --wave 9", "--wave"),
    ("grid run --profile local --executor no-such-executor", "no-such-executor"),
    ("grid run --profile local --bogus", "--bogus"),
    ("report", "--profile"), ("report --profile no-such-profile", "no-such-profile"),
    ("report budget --datasets nope", "nope"), ("report controls", "control"), ("report rows --bogus", "--bogus"),
    ("confirmation", "command"), ("confirmation no-such-verb", "no-such-verb"),
    ("confirmation judge --bogus", "--bogus"),
    ("confirmation wave2 no-such-verb", "no-such-verb"), ("confirmation wave3 margins", "margins"),
    ("confirmation wave4", "command"), ("confirmation wave4 status --claims --bogus", "--bogus"),
    ("stamp --profile no-such-profile", "no-such-profile"), ("gpu-check --skip no-such-step", "no-such-step"),
    ("gpu-check --jobs", "--jobs"),
    ("train", "--base"), ("generate --bogus", "--bogus"), ("evaluate --plugin p", "--data"),
    ("serve --bogus", "--bogus"),
]


def test_every_door_is_checked():
    import typer

    from plugin_lib.__main__ import app

    commands = typer.main.get_command(app).commands
    groups = {name for name, command in commands.items() if hasattr(command, "commands")}
    doors = {f"{name} {sub}" if name in groups else name for name in commands
             for sub in (commands[name].commands if name in groups else [""])}
    assert doors == {c for c in HELP if c.split()[0] != "confirmation" and not c.startswith("report ")} | {"confirmation"}
    assert doors == {" ".join(a.split()[:2]) if a.split()[0] in groups else a.split()[0] for a, _ in USAGE_ERRORS}


def through_the_door(args: str) -> tuple[dict, subprocess.CompletedProcess]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args.split()], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    return json.loads(done.stdout.splitlines()[-1]), done


@pytest.mark.parametrize("command", HELP)
def test_every_commands_help_comes_before_its_heavy_imports(command):
    found, done = through_the_door(f"{command} --help")
    assert found == {"status": 0, "heavy": []}, done.stderr
    help_text = done.stdout.rpartition("\n{")[0]
    door = " ".join(command.split()[:2] if command.split()[0] in ("data", "grid") else command.split()[:1])
    assert f"plugin-repro {door}" in help_text and "--" in help_text and done.stderr == ""  # the name the user typed


@pytest.mark.parametrize(("args", "named"), USAGE_ERRORS)
def test_every_usage_error_comes_before_the_heavy_imports(args, named):
    found, done = through_the_door(args)
    assert found == {"status": 2, "heavy": []}, done.stderr
    assert named in done.stderr


def test_the_grid_package_imports_without_its_units():
    """The grid's door imports the package for its executors' names: it loads the executors,
    plans and units (torch) only when a name of theirs is used."""
    check = (f"import sys, plugin_lib.harness.grid as grid\n"
             f"print([h for h in {HEAVY!r} if any(m == h or m.startswith(h + '.') for m in sys.modules)])\n"
             f"grid.Unit\nprint('plugin_lib.harness.grid.units' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.stdout.split() == ["[]", "True"], done.stderr
