"""Errors the converters raise, each with the exit code the bnnexport CLI uses.

`converters` never imports bnnexport, so it has its own types; the CLI turns any exception that
carries an integer `exit_code` into one line (1 = a check on the model failed, 2 = bad input).

Example:
    >>> from converters.errors import UnsupportedOpError
    >>> UnsupportedOpError("/head/Erf", "Erf", ["Conv", "Relu"]).exit_code
    2
"""

from __future__ import annotations

from collections.abc import Iterable


class ConverterError(Exception):
    """Base class: a problem to report as one line, never as a traceback."""

    exit_code = 2


class UnsupportedOpError(ConverterError):
    """An ONNX node the translator cannot turn into TensorFlow exactly."""

    def __init__(self, node_name: str, op_type: str, supported: Iterable[str], why: str = ""):
        self.node_name = node_name
        self.op_type = op_type
        reason = f" ({why})" if why else ""
        super().__init__(
            f"unsupported ONNX node {node_name!r} of op type {op_type}{reason}; "
            f"supported op types: {', '.join(sorted(set(supported)))}"
        )


class InvalidModelError(ConverterError):
    """A file that is not a readable ONNX model or flatbuffer (missing, truncated, foreign)."""


class ConversionMismatchError(ConverterError):
    """The converted model disagrees with its reference beyond the tolerance (the fidelity gate)."""

    exit_code = 1


class FloatFallbackError(ConverterError):
    """A binary layer (±1 kernel) would stay a float layer in the flatbuffer."""

    exit_code = 1


class InputShapeError(ConverterError):
    """Inputs given to a model do not have the shape the model takes."""


class ZeroSignError(ConverterError):
    """A plain `Sign` (sign(0) = 0) converted as sign(0) = +1 met an exact zero on a check sample:
    the flatbuffer could differ from the model there."""

    exit_code = 1
