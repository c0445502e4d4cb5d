"""`specbench` command line: a thin layer over specbench.sweep, .fit, .report and .gate, one module
per command (sweep, report, check, plan, models, workloads), their printing in `render`."""

from specbench.cli.common import console, errors, split_drafts, token_count, token_counts
from specbench.cli.main import app, main
from specbench.cli.render import cells_table, progress_line

__all__ = ["app", "main", "console", "errors", "cells_table", "progress_line", "split_drafts", "token_count",
           "token_counts"]
