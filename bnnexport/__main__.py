"""`python -m bnnexport` (and the `bnnexport` script) runs the command line.

Ctrl-C ends every command with one line and exit code 130, even when it arrives while torch is
still being imported, or inside third-party code that catches the KeyboardInterrupt and carries
on: the interrupt is remembered here, before anything else is imported. If the process still
runs a few seconds after the first Ctrl-C (a library swallowed the KeyboardInterrupt and the
command went on, e.g. into training), a watchdog ends it with the same line and exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

_interrupts: list[int] = []
UNWIND_SECONDS = 10.0  # enough for any `finally` block bnnexport runs; then the watchdog ends it


def _on_sigint(signum: int, _frame: Any) -> None:
    _interrupts.append(signum)
    if len(_interrupts) == 1:  # a second Ctrl-C while shutting down changes nothing
        watchdog = threading.Timer(UNWIND_SECONDS, _exit_interrupted, kwargs={"printed": False})
        watchdog.daemon = True
        watchdog.start()
        raise KeyboardInterrupt


def run() -> None:
    """Run the CLI; exit 130 with one line if the user interrupted it at any point."""
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        from bnnexport.cli import main

        if _interrupts:  # swallowed while a dependency was being imported
            raise KeyboardInterrupt
        main(prog_name="bnnexport")
    except KeyboardInterrupt:
        _exit_interrupted(printed=False)
    except SystemExit as done:
        if _interrupts and done.code in (0, None):  # the interrupt was swallowed somewhere
            _exit_interrupted(printed=False)
        if _interrupts:
            _exit_interrupted(printed=True)
        raise


def _exit_interrupted(printed: bool) -> None:
    """Exit 130 now. The command has unwound (its `finally` blocks ran, temporary files are
    gone); os._exit keeps a KeyboardInterrupt still pending inside a library's C code from
    surfacing during interpreter shutdown, which would end the process with SIGINT instead."""
    if threading.current_thread() is threading.main_thread():  # the watchdog cannot, nor needs to
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not printed:
        sys.stderr.write("bnnexport: error: interrupted\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


if __name__ == "__main__":
    run()
