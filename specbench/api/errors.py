"""The one error the API raises for bad input. Its message names the command-line option, as a
user of the command types it; `specbench` prints it as one line and exits 2."""


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""
