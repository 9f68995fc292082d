"""The three ways a test drives the CLI, defined once.

- `invoke(*args)`: in this process through click's CliRunner; click's `Result` (`exit_code`,
  `stdout`, `stderr` kept apart, `output`, and `exception` for one the CLI did not turn into
  an exit code). For what a command prints and returns.
- `run_in_process(*args)`: the same, answering like `subprocess.run` (`returncode`), and
  raising an exception the CLI did not turn into an exit code (a traceback is a failure).
- `run_process(*args)`: `python -m bnnexport` in a new process. For process-level behaviour:
  signals, `python -m`, locks between processes, a fresh interpreter's imports.
"""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner, Result

from bnnexport.cli import main

COMMAND = [sys.executable, "-m", "bnnexport"]


def invoke(*args: object) -> Result:
    """`bnnexport ARGS` in this process (each argument str()'d)."""
    return CliRunner().invoke(main, [str(a) for a in args])


def run_in_process(*args: object) -> subprocess.CompletedProcess:
    """`bnnexport ARGS` in this process: returncode, stdout and stderr kept apart. An exception
    the CLI did not turn into an exit code is raised, as a traceback would be a failure."""
    result = invoke(*args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["bnnexport", *map(str, args)], result.exit_code, result.stdout, result.stderr
    )


def run_process(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m bnnexport ARGS` in a new process (text output, `timeout` seconds)."""
    return subprocess.run(
        [*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )
