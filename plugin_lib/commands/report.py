"""``plugin-repro report``: REPORT.md and the README block (``--profile NAME [--readme]``), or one of
the checks beside them: ``budget`` (the equal-budget audit of the stored runs), ``rows`` (the
paper's other claims, judged), ``controls`` (sampled-base and icl-copying, the exploratory
controls).

Its parsers read only the profiles' names, so that ``--help`` and a usage error are answered
before ``commands.document`` (or the verb's module) imports the tables, figures and base models.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..harness import profile as config

DATASETS = ("e2e", "webnlg", "commongen", "adidas")  # data.DATASETS, whose package loads pandas
VERBS = ("budget", "rows", "controls")


def verb_parser(verb: str) -> argparse.ArgumentParser:
    """The parser of ``plugin-repro report VERB``."""
    prog = f"plugin-repro report {verb}"
    if verb == "budget":
        parser = argparse.ArgumentParser(prog=prog, description="The training-budget audit of a profile's stored "
                                         "runs, per dataset (the notebooks save it as main_<dataset>_budget).")
        parser.add_argument("--profile", default="local", choices=config.profile_names())
        parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    elif verb == "rows":
        parser = argparse.ArgumentParser(prog=prog, description="The paper's claims that have no preregistered "
                                         "rule, judged on a profile's runs (REPORT.md's 'other claims').")
        parser.add_argument("--profile", default="confirm", choices=config.profile_names())
    else:
        parser = argparse.ArgumentParser(prog=prog, description="Exploratory controls: sampled-base, the base alone "
                                         "sampled as TempNet samples, beside Zeroshot and TempNet; icl-copying, how "
                                         "often ICL outputs copy their demonstrations.")
        parser.add_argument("control", choices=("sampled-base", "icl-copying"))
        parser.add_argument("--profile", default="local", choices=config.profile_names())
        parser.add_argument("--datasets", nargs="+", default=["e2e"], choices=DATASETS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in VERBS:
        args = verb_parser(argv[0]).parse_args(argv[1:])
        if argv[0] == "budget":
            from ..report.budget import print_audit

            print_audit(args.profile, args.datasets)
        elif argv[0] == "rows":
            from ..report.paper_rows import print_judged

            print_judged(args.profile)
        else:
            from ..experiments.main_tables import print_control

            print_control(args.control, args.profile, args.datasets)
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
