"""``plugin-repro report --profile NAME [--readme]`` (``python -m plugin_lib.report``): write
REPORT.md, and the README's results block (``report.document``).

Its parser reads only the profiles' names, so that ``--help`` and a usage error are answered
before ``report.document`` imports the tables, figures and base models.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..harness import profile as config


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write results/<profile>/REPORT.md")
    parser.add_argument("--profile", required=True, choices=config.profile_names())
    parser.add_argument("--readme", action="store_true", help="also refresh the README's results block")
    args = parser.parse_args(argv)
    from .document import update_readme, write_report

    print(write_report(args.profile))
    if args.readme:
        print(update_readme(args.profile))


if __name__ == "__main__":
    main()
