"""ONNX binarized neural networks -> TensorFlow (NHWC) -> Larq Compute Engine flatbuffers.

Works on any ONNX BNN whose binarization the normalising front end (`converters.normalize`)
maps to one of the patterns in `converters.patterns` and whose binary kernels are ±1 (or ±1
times a per-channel scale) once constants are folded; with `ConvertOptions(float_layers=
"int8")` its float layers run in int8 (`converters.quantize`). Never imports bnnexport;
TensorFlow and LCE are imported only inside the functions that need them.

Example:
    >>> from converters import convert_onnx, find_binary_layers
    >>> result = convert_onnx("model.onnx", "model-arm64.tflite")   # doctest: +SKIP
    >>> result.op_histogram["LceBconv2d"] == result.binary_layers   # doctest: +SKIP
    True
"""

from converters.errors import (
    ConversionMismatchError,
    ConverterError,
    FloatFallbackError,
    InvalidModelError,
    UnsupportedOpError,
    ZeroSignError,
)
from converters.flatbuffer import op_histogram
from converters.gate import GateOptions, GateReport, compare
from converters.gate.checks import Reference
from converters.lce import ConversionResult, ConvertOptions, convert_onnx
from converters.normalize import NormalizeReport
from converters.patterns import BinaryLayerMatch, find_binary_layers
from converters.runtimes import RuntimeModel, open_model, run_lce, run_onnx, run_tflite

__all__ = [
    "BinaryLayerMatch",
    "ConversionMismatchError",
    "ConversionResult",
    "ConvertOptions",
    "ConverterError",
    "FloatFallbackError",
    "GateOptions",
    "GateReport",
    "InvalidModelError",
    "NormalizeReport",
    "Reference",
    "RuntimeModel",
    "UnsupportedOpError",
    "compare",
    "convert_onnx",
    "find_binary_layers",
    "op_histogram",
    "open_model",
    "run_lce",
    "run_onnx",
    "run_tflite",
    "ZeroSignError",
]
