"""``python -m plugin_lib.report --profile NAME [--readme]``: write REPORT.md (and the README block)."""
from .document import main

main()
