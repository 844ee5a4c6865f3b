"""``python -m plugin_lib.report --profile NAME [--readme]``: write REPORT.md (and the README block)."""
from .cli import main

main()
