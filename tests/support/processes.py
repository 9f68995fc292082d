"""This machine's processes, for tests that check something stopped everything it started."""

from __future__ import annotations

from pathlib import Path


def processes_mentioning(text: str) -> list[int]:
    """The ids of the processes whose command line contains `text` (read from /proc, so the
    reading starts no process of its own that could match)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(
                errors="replace"
            ):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found
