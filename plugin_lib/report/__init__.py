"""Turning stored runs into results: tables and statistics, figures, claims and verdicts, and the
one writer of result files. REPORT.md and the README block, which lay them out study by study,
are ``commands.report`` (``plugin-repro report``)."""
