"""What every command shares: the consoles, bad input as one line (exit 2), list and token-count
parsing and the exit codes. Picking a run's cells is specbench.api.runs'."""

from __future__ import annotations

import math
import os
import signal
import sys

import typer
from rich.console import Console
from rich.markup import escape

from specbench.api.errors import UsageError
from specbench.api.inputs import check_price  # noqa: F401  (report's and plan's --gpu-price)

# Without a terminal (a log file, CI, nohup) rich would cut lines at 80 columns: there, lines are as
# wide as their content unless COLUMNS says otherwise; in a terminal, table cells fold, never cut.
_LOG_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 1000
# Emoji codes off: "--trace-window 5000:100: no request ..." printed ":100:" as an emoji.
console = Console(width=_LOG_WIDTH, emoji=False)
errors = Console(stderr=True, width=_LOG_WIDTH, emoji=False)


def fail(message: str, code: int = 2) -> None:
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def quiet_libraries(allow_download: bool = False) -> None:
    if not allow_download:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def typed_options(ctx) -> set[str]:
    """A command's parameters given on its command line, not left at their defaults."""
    return {name for name in ctx.params
            if (source := ctx.get_parameter_source(name)) is not None
            and source.name not in ("DEFAULT", "DEFAULT_MAP")}


def option_flag(parameter: str) -> str:
    """How a user types a command's parameter: `--max-new-tokens` for max_new_tokens."""
    return {"json_output": "--json", "run_dir": "RUN_DIR"}.get(parameter, "--" + parameter.replace("_", "-"))


def split_list(text: str, cast, name: str) -> list:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise UsageError(f"{name} needs a comma-separated list, got {text!r}")
    try:
        return [cast(item) for item in items]
    except UsageError:
        raise
    except ValueError:
        raise UsageError(f"{name}: {text!r} is not a list of {cast.__name__}s") from None


def token_count(text: str, name: str = "--context-length") -> int:
    """A number of tokens: 512, 4k (4096), 1.5k (1536), 16K, 1m (1048576)."""
    value = text.strip().lower()
    scale = {"k": 1 << 10, "m": 1 << 20}.get(value[-1:], 1)
    try:
        count = float(value[:-1] if scale > 1 else value) * scale
    except ValueError:
        raise UsageError(f"{name}: {text!r} is not a number of tokens (512, 4k, 1.5k, 1m)") from None
    if not (math.isfinite(count) and count == int(count) and count > 0):
        raise UsageError(f"{name}: {text!r} is not a whole, positive number of tokens") from None
    return int(count)


def token_counts(text: str, name: str) -> list[int]:
    return split_list(text, lambda item: token_count(item, name), name)


def split_drafts(text: str) -> list[str]:
    """--drafts: a comma list whose items may be json:{...} with commas inside the braces."""
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"{": 1, "[": 1, "}": -1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    items = [item.strip() for item in items]
    if not text.strip() or any(not item for item in items):
        raise UsageError(f"--drafts needs a comma-separated list, got {text!r}")
    return items


def known_errors():
    from specbench.engines import StageFailed
    from specbench.models import IncompatibleModels, ModelNotAvailable
    from specbench.results import RunNotFound
    from specbench.served.server import ServerError
    from specbench.workloads import WorkloadError

    return (UsageError, ModelNotAvailable, IncompatibleModels, WorkloadError, RunNotFound, ValueError, ServerError,
            StageFailed)

class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the program is, so that it stops as on Ctrl-C: finished cells kept,
    servers stopped, run.json `interrupted`."""


# SIGINT and SIGTERM this command received, in order (main() installs on_stop_signal for both).
signals_received: list[int] = []


def _stop_exception(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def on_stop_signal(signum: int, frame) -> None:
    signals_received.append(signum)
    raise _stop_exception(signum)


def raise_if_stopped() -> None:
    """Raise again for a stop signal whose exception never arrived. Python raises a signal's
    exception wherever the main thread is, and it can be lost on the way: raised inside a
    finaliser (`__del__` of a socket the garbage collector frees), Python only prints it, and a
    library may catch it. Called where the work can stop cleanly (before a cell starts), this makes
    such a Ctrl-C or SIGTERM stop the command there instead of being forgotten."""
    if signals_received:
        raise _stop_exception(signals_received[-1])


def stop_code() -> int:
    """The exit code of a command the last stop signal ended: 143 after SIGTERM, 130 otherwise."""
    return TERMINATED if signals_received and signals_received[-1] == signal.SIGTERM else INTERRUPTED


INTERRUPTED, TERMINATED, PIPE_CLOSED = 130, 143, 141  # 128 + SIGINT, SIGTERM, SIGPIPE, as a shell reports them
# The gate's exit codes for what is not a verdict (specbench.gate holds them all; main() needs these two
# before any command ran, and importing the gate would load pandas and scipy for `--help`)
UNANSWERABLE, INTERNAL_ERROR = 2, 4
# What each exit code means for every command; check's verdicts are specbench.gate.EXIT_CODES.
# docs/reference/exit-codes.md is generated from both (docs/generate_reference.py).
COMMAND_EXIT_CODES = {
    0: "the command did what it was asked",
    1: "`sweep` only: a speculative cell failed the lossless check",
    UNANSWERABLE: "bad input, a path that cannot be read or written, or nothing measured: one line on stderr",
    INTERNAL_ERROR: "internal error: a bug in specbench; one line, the traceback saved to a file it names",
    INTERRUPTED: "stopped by Ctrl-C (SIGINT): a sweep keeps its finished cells and `run.json` says `interrupted`; "
                 "a `plan` simulation prints the configurations it finished",
    TERMINATED: "stopped by SIGTERM, as by Ctrl-C",
    PIPE_CLOSED: "its output pipe was closed (a reader that stops early, under `set -o pipefail`): "
                 "write `check --json` to a file to keep the verdict",
}
