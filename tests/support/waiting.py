"""Condition-based waits for tests that drive a live `bnnexport train` process.

A fixed `sleep` after an event guesses how fast this machine is; these wait for the state the
test needs (a checkpoint, a step record of a given epoch) and fail loudly when it never comes.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    process: subprocess.Popen | None = None,
) -> None:
    """Poll `condition` until it holds; AssertionError naming `what` after `timeout` seconds or
    when `process` exits first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process exited ({process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.05)


def training_in_epoch(run: Path, epoch: int) -> Callable[[], bool]:
    """A condition: metrics.jsonl of `run` holds a step record of `epoch` (1-based), i.e. the
    process is past that epoch's first logged step and before its checkpoint."""

    def holds() -> bool:
        try:
            lines = (run / "metrics.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return False
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line being written
                continue
            if record.get("kind") == "step" and record.get("epoch", 0) >= epoch:
                return True
        return False

    return holds
