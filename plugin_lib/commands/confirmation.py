"""The command line of the preregistered confirmation, every wave: ``status`` (per claim, ready
or what is missing), ``judge`` (the frozen rules' verdicts, into results/<profile>/claims) and,
for waves 1 and 2, ``margins`` (the null claims at 1x, 0.5x and 0.25x their frozen margins, for
REPORT.md).

    plugin-repro confirmation status|judge|margins          # wave 1: experiments.confirmation
    plugin-repro confirmation wave2 status|judge|margins    # wave 2: commands.confirmation_wave2
    plugin-repro confirmation wave3|wave4 status|judge      # commands.confirmation_wave3, _wave4

Each wave's parser is declared here, apart from its module, so that ``--help`` and a usage error
are answered before the module (torch, every notebook's module) is imported.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..harness.machine import results_dir
from ..harness.profile import load_profile
from ..utils.io import atomic_write_json


@dataclass(frozen=True)
class Wave:
    """A wave's command line: its parser's ``prog``, ``description`` and ``commands``, and the
    module whose ``status``, ``judge`` (and ``margin_sensitivity`` with its ``PROFILE`` and
    ``MARGINS_FILE``, for ``margins``) serve them. ``extra``: a wave's own commands (name: a
    function of the module whose rows are printed)."""

    prog: str
    description: str
    module: str
    commands: tuple[str, ...] = ("status", "judge")
    extra: dict[str, str] = field(default_factory=dict)


WAVES = {
    "wave1": Wave("plugin-repro confirmation", "The preregistered confirmation: status, judge, or the null claims' "
                  "margin sensitivity (written for REPORT.md).", "plugin_lib.experiments.confirmation",
                  ("status", "judge", "margins")),
    "wave2": Wave("plugin-repro confirmation wave2", "The second preregistered wave: status, judge, margins.",
                  "plugin_lib.commands.confirmation_wave2", ("status", "judge", "margins"),
                  extra={"would-be": "premise_ignored"}),
    "wave3": Wave("plugin-repro confirmation wave3", "The third preregistered wave: status, or judge its claims.",
                  "plugin_lib.commands.confirmation_wave3"),
    "wave4": Wave("plugin-repro confirmation wave4", "The fourth preregistered wave: status, or judge its claims.",
                  "plugin_lib.commands.confirmation_wave4"),
}


def build_parser(wave: Wave) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=wave.prog, description=wave.description)
    parser.add_argument("command", choices=(*wave.commands, *wave.extra))
    parser.add_argument("--claims", nargs="*", help="only these claim keys (judge)")
    return parser


def command_line(name: str, argv: Sequence[str] | None) -> None:
    """Wave ``name``'s ``status``, ``judge``, ``margins`` or own command, with its module's functions."""
    wave = WAVES[name]
    args = build_parser(wave).parse_args(argv)
    module = importlib.import_module(wave.module)
    if args.command in wave.extra:
        for row in getattr(module, wave.extra[args.command])():
            print(row)
    elif args.command == "status":
        print(module.status().to_string(index=False))
    elif args.command == "margins":
        from ..experiments.confirmation import MARGIN_FACTORS

        profile = load_profile(module.PROFILE)
        path = results_dir(profile) / module.MARGINS_FILE
        atomic_write_json(path, {"factors": list(MARGIN_FACTORS), "claims": module.margin_sensitivity(profile)})
        print(path)
    else:
        for claim in module.judge(keys=args.claims):
            print(f"{claim['key']}: {claim['verdict']} ({claim['statistic']['summary']})")


def main(argv: Sequence[str] | None = None) -> None:
    """Wave 1's commands; ``wave2 ...``, ``wave3 ...``, ``wave4 ...`` the later waves'."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in WAVES and argv[0] != "wave1":
        command_line(argv[0], argv[1:])
    else:
        command_line("wave1", argv)


if __name__ == "__main__":
    sys.exit(main())
