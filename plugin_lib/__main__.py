"""``plugin-repro`` (or ``python -m plugin_lib``): the package's one command-line front door.

Every job the README shows is a subcommand; each hands its arguments, unchanged, to the module
that does the job, so ``plugin-repro preflight --help`` is the preflight's own help and the
``python -m`` paths keep working:

    plugin-repro run --profile local            plugin_lib.commands.run (a checkout): data, notebooks, report
    plugin-repro data fetch|check ...           plugin_lib.data.fetch, plugin_lib.data.check
    plugin-repro preflight --profile paper ...  plugin_lib.commands.preflight
    plugin-repro grid plan|run ...              plugin_lib.commands.grid
    plugin-repro report --profile local ...     plugin_lib.commands.report (REPORT.md, the README block)
    plugin-repro confirmation [wave2|3|4] status|judge       plugin_lib.commands.confirmation, then commands.confirmation_wave2, _wave3, _wave4
    plugin-repro stamp --profile local --check [NB...]       plugin_lib.commands.stamp
    plugin-repro gpu-check [--only NB] [--deadline-s S]    plugin_lib.commands.gpu_check (a checkout)
    plugin-repro train|generate|evaluate|serve  plugin_lib.serving.cli (a Plugin on your own data)

An entry point sits above every layer (tests/test_architecture.py): it composes them, and
nothing imports it. The jobs' modules are imported only when their command runs, and each parses
its arguments before importing its work (torch, the notebooks' modules): every --help and usage
error is answered at once (tests/test_front_door.py).
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import typer

from .serving import cli as serving

REPO_ROOT = Path(__file__).resolve().parent.parent
# A command that passes everything after its name to the job's own parser, --help included.
PASS_ON = {"context_settings": {"allow_extra_args": True, "ignore_unknown_options": True},
           "add_help_option": False}

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Reproduce 'Logits are All We Need to Adapt Closed Models', and use the Plugin on your own "
                       "model. Each command's --help is the job's own.")
for command in serving.app.registered_commands:  # train, generate, serve
    app.registered_commands.append(command)
data_app = typer.Typer(no_args_is_help=True, help="The datasets: fetch them, check them.")
grid_app = typer.Typer(no_args_is_help=True, help="The notebooks' units on Ray, Slurm or here (docs/scale.md).")
app.add_typer(data_app, name="data")
app.add_typer(grid_app, name="grid")


def _hand_over(module: str, args: list[str], *, prefix: tuple[str, ...] = ()) -> None:
    """Run ``module``'s ``main`` with ``args`` as its command line; its status is ours."""
    main = importlib.import_module(module).main
    sys.argv = [sys.argv[0], *prefix, *args]  # for parsers that read sys.argv
    status = main([*prefix, *args])
    raise typer.Exit(status if isinstance(status, int) else 0)


def _checkout_file(relpath: str) -> Path:
    path = REPO_ROOT / relpath
    if not path.is_file():
        typer.echo(f"plugin-repro: error: this command needs a checkout of the repository ({relpath} is not "
                   f"beside the package at {REPO_ROOT}): git clone it, then run it there.", err=True)
        raise typer.Exit(2)
    return path


@app.command("run", **PASS_ON)
def run(ctx: typer.Context) -> None:
    """Data, every notebook of a profile, the report (plugin_lib.commands.run; run_all.sh builds .venv first)."""
    from .utils import malloc

    _checkout_file("run_all.sh")  # the notebooks it runs come with a checkout
    if not {"-h", "--help"} & set(ctx.args):
        malloc.restart_with_tunables()  # the grid computes in this process (--executor)
    _hand_over("plugin_lib.commands.run", ctx.args)


@data_app.command("fetch", **PASS_ON)
def data_fetch(ctx: typer.Context) -> None:
    """Download the datasets, SHA-256 verified (python -m plugin_lib.data.fetch)."""
    _hand_over("plugin_lib.data.fetch", ctx.args)


@data_app.command("check", **PASS_ON)
def data_check(ctx: typer.Context) -> None:
    """Check the data folder against its checksums (python -m plugin_lib.data.check)."""
    from .data.check import main
    from .harness.profile import profile_names

    sys.argv = [sys.argv[0], *ctx.args]
    raise typer.Exit(main(ctx.args, profiles=profile_names()))


@app.command("preflight", **PASS_ON)
def preflight(ctx: typer.Context) -> None:
    """A run's plan: work, memory, disk and hours per notebook (python -m plugin_lib.commands.preflight)."""
    _hand_over("plugin_lib.commands.preflight", ctx.args)


@grid_app.command("plan", **PASS_ON)
def grid_plan(ctx: typer.Context) -> None:
    """The units, their states and the wall time on 1, 8 and 32 GPUs."""
    _grid("plan", ctx.args)


@grid_app.command("run", **PASS_ON)
def grid_run(ctx: typer.Context) -> None:
    """Compute the pending units with an executor (local, ray, slurm)."""
    _grid("run", ctx.args)


def _grid(verb: str, args: list[str]) -> None:
    from .commands.grid import build_parser
    from .utils import malloc

    build_parser().parse_args([verb, *args])  # --help and usage errors before the restart, not after it
    malloc.restart_with_tunables()  # the plan's probe and the local executor compute here
    _hand_over("plugin_lib.commands.grid", args, prefix=(verb,))


@app.command("report", **PASS_ON)
def report(ctx: typer.Context) -> None:
    """Write results/<profile>/REPORT.md, and with --readme the README's block (plugin_lib.commands.report)."""
    _hand_over("plugin_lib.commands.report", ctx.args)


@app.command("confirmation", **PASS_ON)
def confirmation(ctx: typer.Context) -> None:
    """The preregistered confirmation: status, judge, margins; `confirmation wave2|wave3|wave4 ...` the
    later waves (python -m plugin_lib.commands.confirmation, plugin_lib.commands.confirmation_wave2, _wave3, _wave4)."""
    _hand_over("plugin_lib.commands.confirmation", ctx.args)  # it parses every wave's arguments


@app.command("stamp", **PASS_ON)
def stamp(ctx: typer.Context) -> None:
    """Notebook stamps; --check compares them with results/<profile>/executed (plugin_lib.commands.stamp)."""
    from .commands import stamp as stamps

    raise typer.Exit(stamps.main(ctx.args))


@app.command("gpu-check", **PASS_ON)
def gpu_check(ctx: typer.Context) -> None:
    """The GPU checklist in minutes: pytest -m gpu, every notebook on the full-size twins, bench_gpu.py,
    measured rates, into results/gpu/<gpu>_<date>/ (python -m plugin_lib.commands.gpu_check)."""
    _checkout_file("run_all.sh")  # the notebooks it runs come with a checkout
    _hand_over("plugin_lib.commands.gpu_check", ctx.args)


serving.one_paragraph_listings(app, data_app, grid_app)


# Commands that read or write the checkout itself (its notebooks, results and report): run from
# another checkout they would mix the two, so they refuse; the others only warn.
CHECKOUT_COMMANDS = {"run", "stamp", "report", "gpu-check", "grid", "confirmation", "preflight"}


def other_checkout(cwd: Path | None = None) -> Path | None:
    """The checkout of this repository that holds the working directory, when it is not the one
    whose ``plugin_lib`` was imported (one environment installed from another clone)."""
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "plugin_lib" / "__init__.py").is_file() and (folder / "run_all.sh").is_file():
            return folder if folder != REPO_ROOT.resolve() else None
    return None


def _check_checkout(argv: list[str]) -> None:
    other = other_checkout()
    if other is None:
        return
    command = next((a for a in argv if not a.startswith("-")), "")
    if not command or "--help" in argv or "-h" in argv:
        return
    said = (f"plugin-repro: this command runs the plugin_lib of {REPO_ROOT}, not of the checkout you are in "
            f"({other}): its environment was installed from the other. Run `bash run_all.sh` or "
            f"`python -m plugin_lib` in {other}, or `pip install -e {other}`.")
    if command in CHECKOUT_COMMANDS:
        typer.echo(f"{said} Nothing was run.", err=True)
        sys.exit(2)
    typer.echo(f"warning: {said}", err=True)


def main() -> None:
    from .harness.profile import ProfileError

    _check_checkout(sys.argv[1:])
    try:
        app(prog_name="plugin-repro")
    except ProfileError as err:  # profiles.yaml, wherever a command reads it: one line, status 2
        typer.echo(f"plugin-repro: error: {err}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
