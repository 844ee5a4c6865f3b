"""Turning stored runs into results: tables and statistics, figures, claims and verdicts, the
one writer of result files, and REPORT.md / the README block (``python -m plugin_lib.report``)."""
