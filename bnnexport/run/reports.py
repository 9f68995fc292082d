"""Report dataclasses: what every pipeline stage returns besides its artifact.

A report is a dataclass; `to_json()` gives a JSON-ready dict and `to_table()` a short
human-readable table. Stages subclass `Report` and add their fields.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class PackReport(Report):
    ...     packed_bytes: int
    ...     ratio: float
    >>> PackReport(packed_bytes=1024, ratio=0.031).to_json()
    {'packed_bytes': 1024, 'ratio': 0.031}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from bnnexport.run.files import write_bytes_atomic

__all__ = [
    "Report",
    "format_value",
    "pyplot",
    "save_figure_atomic",
    "write_bytes_atomic",
    "write_json_atomic",
]


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return _jsonable(value.item())
    return value


def format_value(value: Any) -> str:
    """One table cell: floats to 6 digits, a long list cut short with its length."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple, dict)):
        text = json.dumps(_jsonable(value))
        if len(text) <= 70:
            return text
        count = f" ({len(value)} items)" if isinstance(value, (list, tuple)) else ""
        return text[: 67 - len(count)] + "..." + count
    return str(value)


@dataclasses.dataclass
class Report:
    """Base class of every stage's report."""

    def to_json(self) -> dict[str, Any]:
        """Return the report as a dict of JSON-serialisable values."""
        return _jsonable(self)

    def to_table(self) -> str:
        """Return the report as aligned `key  value` lines, for people."""
        data = self.to_json()
        width = max((len(k) for k in data), default=0)
        return "\n".join(f"{k.ljust(width)}  {format_value(v)}" for k, v in data.items())

    def save(self, path: str | os.PathLike) -> Path:
        """Write the report as pretty JSON, atomically."""
        return write_json_atomic(path, self.to_json())


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    """Write `data` as JSON to `path` through a temporary file and a rename (never half-written)."""
    return write_bytes_atomic(path, (json.dumps(_jsonable(data), indent=2) + "\n").encode())


def pyplot():  # noqa: ANN201 (matplotlib.pyplot, imported on first use)
    """matplotlib.pyplot with the file-only Agg backend (no display needed, e.g. over SSH)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure_atomic(figure: Any, path: str | os.PathLike, dpi: int = 100) -> Path:
    """Save a matplotlib figure as PNG through `write_bytes_atomic` (an interrupt mid-way
    leaves the previous image, never half of one)."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return write_bytes_atomic(path, buffer.getvalue())
