"""JSON lines (metrics.jsonl): appended a line at a time, read back skipping a torn last line.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "m.jsonl"
    >>> append_jsonl(path, [{"step": 1}]); read_jsonl(path)
    [{'step': 1}]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


def append_jsonl(path: str | os.PathLike, records: list[dict[str, Any]]) -> None:
    """Append JSON lines; lines are small, so a crash loses at most the lines being written."""
    with open(path, "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read JSON lines, skipping a torn last line left by a crash."""
    records = []
    path = Path(path)
    if not path.is_file():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
