"""The command line of the preregistered confirmation, both waves: ``status`` (per claim, ready
or what is missing), ``judge`` (the frozen rules' verdicts, into results/confirm/claims) and
``margins`` (the null claims at 1x, 0.5x and 0.25x their frozen margins, for REPORT.md).

    plugin-repro confirmation status|judge|margins          # wave 1: experiments.confirmation
    plugin-repro confirmation wave2 status|judge|margins    # wave 2: commands.confirmation_wave2
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..experiments import confirmation
from ..harness.profile import load_profile, results_dir
from ..report import freeze
from ..utils.io import atomic_write_json


def command_line(argv: Sequence[str] | None, *, prog: str, description: str, profile_name: str, margins_file: str,
                 status, judge, margin_sensitivity, extra: dict | None = None) -> None:
    """``status``, ``judge`` or ``margins`` of a wave, with that wave's functions; ``extra``: a
    wave's own commands (name: a function whose rows are printed)."""
    extra = extra or {}
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("command", choices=("status", "judge", "margins", *extra))
    parser.add_argument("--claims", nargs="*", help="only these claim keys (judge)")
    args = parser.parse_args(argv)
    if args.command in extra:
        for row in extra[args.command]():
            print(row)
    elif args.command == "status":
        print(status().to_string(index=False))
    elif args.command == "margins":
        profile = load_profile(profile_name)
        path = results_dir(profile) / margins_file
        atomic_write_json(path, {"factors": list(confirmation.MARGIN_FACTORS), "claims": margin_sensitivity(profile)})
        print(path)
    else:
        for claim in judge(keys=args.claims):
            print(f"{claim['key']}: {claim['verdict']} ({claim['statistic']['summary']})")


def main(argv: Sequence[str] | None = None) -> None:
    """Wave 1's commands."""
    command_line(argv, prog="plugin-repro confirmation", profile_name=freeze.FROZEN_PROFILE,
                 margins_file=confirmation.MARGINS_FILE,
                 description="The preregistered confirmation: status, judge, or the null claims' margin sensitivity "
                             "(written for REPORT.md).",
                 status=confirmation.status, judge=confirmation.judge,
                 margin_sensitivity=confirmation.margin_sensitivity)


if __name__ == "__main__":
    sys.exit(main())
