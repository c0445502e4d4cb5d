"""`specbench report`: a run's analysis (analysis.py), its charts (charts.py) and the page that
holds them (page.py). Importing this package loads no matplotlib; `write_report` (page.py) does."""

from specbench.report.analysis import (  # noqa: F401
    ALPHA_NOTE, TABLE_NOTES, Analysis, analyse, answer, engine_label, summary_tables,
)


def __getattr__(name: str):
    if name == "write_report":  # charts, report.html and summary.md: loads matplotlib
        from specbench.report.page import write_report

        return write_report
    raise AttributeError(f"module 'specbench.report' has no attribute {name!r}")
