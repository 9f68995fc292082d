"""Errors the converters raise, each with the exit code the bnnexport CLI uses.

`converters` never imports bnnexport, so it has its own types; the CLI turns any exception that
carries an integer `exit_code` into one line (1 = a check on the model failed, 2 = bad input).

Example:
    >>> from bnnexport.converters.errors import UnsupportedOpError
    >>> UnsupportedOpError("/head/Erf", "Erf", ["Conv", "Relu"]).exit_code
    2
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class ConverterError(Exception):
    """Base class: a problem to report as one line, never as a traceback."""

    exit_code = 2


class UnsupportedOpError(ConverterError):
    """An ONNX node the translator cannot turn into TensorFlow exactly: named with the PyTorch
    module it came from (`module`, as "PyTorch module 'blocks.1'"; empty when unknown), why
    (`why`), what to write instead (`hint`) and the op types the translator takes (`supported`).

    >>> print(UnsupportedOpError("/h/Abs", "Abs", module="PyTorch module 'h'", hint="write relu"))
    unsupported ONNX node '/h/Abs' of op type Abs, from PyTorch module 'h'; instead, write relu
    """

    def __init__(
        self,
        node_name: str,
        op_type: str,
        supported: Iterable[str] = (),
        why: str = "",
        hint: str = "",
        module: str = "",
    ):
        super().__init__(node_name, op_type, why)
        self.node_name = node_name
        self.op_type = op_type
        self.why = why
        self.hint = hint
        self.module = module
        self.supported = sorted(set(supported))  # the translator fills it in (`listing`)

    def listing(self, supported: Iterable[str]) -> UnsupportedOpError:
        """This error, naming the op types the translator supports."""
        self.supported = sorted(set(supported))
        return self

    def __str__(self) -> str:
        where = f", from {self.module}" if self.module else ""
        reason = f" ({self.why})" if self.why else ""
        instead = f"; instead, {self.hint}" if self.hint else ""
        known = f"; supported op types: {', '.join(self.supported)}" if self.supported else ""
        return (
            f"unsupported ONNX node {self.node_name!r} of op type {self.op_type}{where}{reason}"
            f"{instead}{known}"
        )


class InvalidModelError(ConverterError):
    """A file that is not a readable ONNX model or flatbuffer (missing, truncated, foreign)."""


class ConversionMismatchError(ConverterError):
    """The converted model disagrees with its reference beyond the tolerance (the fidelity gate).

    `diagnostics` holds what the gate saw (`converters.gate.mismatch_diagnostics`), for the
    caller to write beside the run: the message stays one line."""

    exit_code = 1

    def __init__(self, message: str, diagnostics: dict[str, Any] | None = None):
        super().__init__(message)
        self.diagnostics = diagnostics if diagnostics is not None else {}


class InconclusiveCheckError(ConversionMismatchError):
    """The real-weight check cannot decide: more binarization inputs lie within rounding of
    zero than rounding ties could explain (a degenerate model, e.g. untrained BatchNorm)."""


class FloatFallbackError(ConverterError):
    """A binary layer (±1 kernel) would stay a float layer in the flatbuffer."""

    exit_code = 1


class UnknownLayerError(ConverterError):
    """A layer named to stay float (`allow_float`) that is not a binary layer of the model."""


class InputShapeError(ConverterError):
    """Inputs given to a model do not have the shape the model takes: samples or calibration
    data for a converted model, or a data set's images for a model about to be trained (the
    one class for both; `bnnexport.errors` hands it on)."""


class ZeroSignError(ConverterError):
    """A plain `Sign` (sign(0) = 0) converted as sign(0) = +1 met an exact zero on a check sample:
    the flatbuffer could differ from the model there."""

    exit_code = 1


class AccuracyDropError(ConversionMismatchError):
    """An int8 model that loses more top-1 accuracy against its float model than allowed
    (`ConvertOptions.max_accuracy_drop`): a check on the model, like the gate's."""
