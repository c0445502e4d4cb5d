"""The `specbench` application: its subcommands, one module each, and the exit code of every way a
command can end."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from specbench.cli.check import check
from specbench.cli.common import (INTERNAL_ERROR, INTERRUPTED, PIPE_CLOSED, UNANSWERABLE, errors, on_stop_signal,
                                  signals_received, stop_code)
from specbench.cli.models import models
from specbench.cli.plan import PlanCommand, plan
from specbench.cli.report import report
from specbench.cli.sweep import sweep
from specbench.cli.workloads import workloads

app = typer.Typer(add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False,
                  help="Measure whether speculative decoding pays off on your models, traffic and hardware. "
                       "Exit codes: 0 pass, 1 fail, 2 cannot answer or bad input, 3 inconclusive, 4 internal "
                       "error, 130/143 stopped by SIGINT/SIGTERM, 141 output pipe closed.")
for command in (sweep, report, check, plan, models, workloads):
    app.command(cls=PlanCommand if command is plan else None)(command)


def _flag_type_hidden() -> None:
    """typer's help prints a flag's type (`--json <bool>`), which reads as if it took a value;
    a flag is shown bare, as click shows it."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "flags_bare", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.flags_bare = True
    TyperOption.display_type_rich = display_type_rich


_flag_type_hidden()

def main(argv: list[str] | None = None) -> None:
    """The `specbench` command. Exit codes (docs/reference/exit-codes.md): 0 pass, 1 fail, 2 cannot
    answer or bad input, 3 inconclusive, 4 internal error, 130/143 stopped by SIGINT/SIGTERM, 141
    its output pipe closed.
    Whatever goes wrong, a traceback never exits 0 or 1."""
    import errno
    import signal

    usage_errors: tuple = ()
    for module in ("typer._click.exceptions", "click.exceptions"):  # newer typer vendors its click
        try:
            usage_errors += (__import__(module, fromlist=["ClickException"]).ClickException,)
        except ImportError:
            pass

    signals_received.clear()  # this call's signals only (a notebook or a test calls main() again)
    # Both stop signals are counted, so that one whose exception was lost still stops the command
    # (common.raise_if_stopped). SIGINT only where Python's own handler is in place: a job started
    # in the background inherits SIGINT ignored, and keeps it so.
    previous_term = signal.signal(signal.SIGTERM, on_stop_signal)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_stop_signal)
    try:
        code = app(args=argv, prog_name="specbench", standalone_mode=False)
    except usage_errors as error:  # bad usage: typer's own message
        error.show()
        code = UNANSWERABLE
    except SystemExit as stop:  # typer exits 1 when a reader closed the output pipe: never read as FAIL
        cause = stop.__context__
        if not (isinstance(cause, OSError) and cause.errno == errno.EPIPE):
            raise
        code = PIPE_CLOSED
    except (typer.Abort, KeyboardInterrupt):
        code = INTERRUPTED  # TERMINATED below when it was SIGTERM
        errors.print("[yellow]stopped[/]", highlight=False)
    except OSError as error:  # a file or directory that cannot be read or written
        where = f"{error.filename}: " if getattr(error, "filename", None) else ""
        errors.print(f"[bold red]error:[/] {escape(where + (error.strerror or str(error)))}", highlight=False,
                     soft_wrap=True)
        code = UNANSWERABLE
    except Exception as error:
        code = INTERNAL_ERROR
        errors.print(f"[bold red]internal error[/] (a bug in specbench, not a verdict): "
                     f"{escape(type(error).__name__)}: {escape((str(error).splitlines() or [''])[0])}; "
                     f"traceback in {_save_traceback()}", highlight=False, soft_wrap=True)
    finally:  # past the command, SIGTERM ends the process as it would have (no exception in atexit code)
        signal.signal(signal.SIGTERM, previous_term)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
    if code == INTERRUPTED:  # typer reports any KeyboardInterrupt (Terminated too) as 130
        code = stop_code()
    sys.exit(code if isinstance(code, int) else 0)


def _save_traceback() -> str:
    import tempfile
    import traceback

    with tempfile.NamedTemporaryFile("w", prefix="specbench-traceback-", suffix=".txt", delete=False) as file:
        traceback.print_exc(file=file)
    return file.name


