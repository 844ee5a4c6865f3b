"""``python -m plugin_lib.harness.grid``: kept for existing command lines. The grid's command is
``plugin-repro grid`` (``plugin_lib.commands.grid``): it composes every notebook's units from the
experiments, above the layers, so this module hands over to it without importing it."""
import os
import sys

if __name__ == "__main__":
    os.execv(sys.executable, [sys.executable, "-m", "plugin_lib", "grid", *sys.argv[1:]])
