"""Step lines for long work on stderr: which step a command is in, and since when.

Shown only when stderr is a terminal (or when asked), never with `--json` or when piped, so
scripts and logs see exactly what they saw before. Written through tqdm, the library `train`'s
progress bars use, so a step line never tears a bar that is on screen.

Example:
    >>> steps = Steps("convert", enabled=False)
    >>> steps("gate on 1000 samples")  # silent: not a terminal, or --json
"""

from __future__ import annotations

import sys
import time


class Steps:
    """Call with a step's description as it starts: `convert: gate on 1000 samples (12.3 s)`,
    the seconds since the command started."""

    def __init__(self, command: str, enabled: bool | None = None) -> None:
        self.command = command
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.perf_counter()

    def __call__(self, step: str) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        elapsed = time.perf_counter() - self.started
        tqdm.write(f"{self.command}: {step} ({elapsed:.1f} s)", file=sys.stderr)
