"""The CLI run in-process through click's CliRunner, answering like `subprocess.run`.

For tests of what a command prints and returns; tests of process-level behaviour (signals,
`python -m`, the console script, locks between processes) start a real process instead.
"""

from __future__ import annotations

import subprocess

from click.testing import CliRunner

from bnnexport.cli import main


def run_in_process(*args: str) -> subprocess.CompletedProcess:
    """`bnnexport ARGS` in this process: returncode, stdout and stderr kept apart. An exception
    the CLI did not turn into an exit code is raised, as a traceback would be a failure."""
    result = CliRunner().invoke(main, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["bnnexport", *args], result.exit_code, result.stdout, result.stderr
    )
