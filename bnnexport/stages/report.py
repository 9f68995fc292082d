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
    "int8_lines",
    "pyplot",
    "save_figure_atomic",
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


def int8_lines(int8: dict[str, Any] | None) -> list[str]:
    """The int8 part of `bnnexport.stages.convert.ConvertReport.to_table`: which layers, how
    quantized, the replay, the accuracy against the float model."""
    if not int8:
        return []
    source = int8["ranges"]
    if source == "calibrated":
        source = f"calibrated on {int8['calibration_samples']} samples"
    check, accuracy = int8["check"], int8["accuracy"]
    lines = [
        f"int8 ({source}, io {int8['io']}): {len(int8['int8_layers'])} layers in int8, "
        f"{int8['int8_ops']} int8 ops, {int8['float_ops']} float conv/dense ops",
        *(f"  float: {layer} ({why})" for layer, why in int8["kept_float"].items()),
        f"  int8 replay: {check['replayed_samples']} samples, {check['int8_tensors']} int8 "
        f"tensors, {check['one_step_positions']} of {check['positions']} positions one step "
        "apart (rounding)",
        f"  against the {accuracy.get('against', 'float model')}: argmax agreement "
        f"{accuracy['float_argmax_agreement']:.4g}",
    ]
    if accuracy["float_top1"] is not None:
        lines[-1] += (
            f", top-1 {100 * accuracy['float_top1']:.2f} % -> {100 * accuracy['int8_top1']:.2f} "
            f"% ({points_changed(accuracy['top1_drop_points'])}) on {accuracy['labelled']} "
            "labelled samples"
        )
    return lines


def points_changed(drop: float) -> str:
    """A drop in accuracy points as words.

    >>> points_changed(0.4), points_changed(-0.4), points_changed(0.001)
    ('0.40 points lost', '0.40 points gained', 'no change')
    """
    if round(drop, 2) == 0:
        return "no change"
    return f"{abs(drop):.2f} points {'lost' if drop > 0 else 'gained'}"
