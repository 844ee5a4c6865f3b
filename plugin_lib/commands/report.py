"""``plugin-repro report``: REPORT.md and the README block (``--profile NAME [--readme]``), or one of
the checks beside them: ``budget`` (the equal-budget audit of the stored runs), ``rows`` (the
paper's other claims, judged), ``controls`` (sampled-base and icl-copying, the exploratory
controls).

Its parser reads only the profiles' names, so that ``--help`` and a usage error are answered
before ``commands.document`` imports the tables, figures and base models.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ..harness import profile as config

# Each verb and the module whose ``main`` takes its arguments (``plugin-repro report VERB --help``).
VERBS = {"budget": "plugin_lib.report.budget", "rows": "plugin_lib.report.paper_rows",
         "controls": "plugin_lib.experiments.main_tables"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in VERBS:
        importlib.import_module(VERBS[argv[0]]).main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(prog="plugin-repro report", description="Write results/<profile>/REPORT.md",
                                     epilog="Verbs: plugin-repro report budget|rows|controls --help: the equal-budget "
                                            "audit, the paper's other claims judged, the exploratory controls.")
    parser.add_argument("--profile", required=True, choices=config.profile_names())
    parser.add_argument("--readme", action="store_true", help="also refresh the README's results block")
    args = parser.parse_args(argv)
    from .document import update_readme, write_report

    print(write_report(args.profile))
    if args.readme:
        print(update_readme(args.profile))
    return 0
