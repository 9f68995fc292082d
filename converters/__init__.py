"""ONNX binarized neural networks -> TensorFlow (NHWC) -> Larq Compute Engine flatbuffers.

Works on any ONNX BNN whose binarization the normalising front end (`converters.normalize`)
maps to one of the patterns in `converters.patterns` and whose binary kernels are ±1 (or ±1
times a per-channel scale) once constants are folded; with `ConvertOptions(float_layers=
"int8")` its float layers run in int8 (`converters.quantize`). Never imports bnnexport;
TensorFlow and LCE are imported only inside the functions that need them.

Example:
    >>> from bnnexport.converters import convert_onnx, find_binary_layers
    >>> result = convert_onnx("model.onnx", "model-arm64.tflite")   # doctest: +SKIP
    >>> result.op_histogram["LceBconv2d"] == result.binary_layers   # doctest: +SKIP
    True
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use: a module of converters/ (its errors, its choices) imported by
# bnnexport's training commands must not pay for ONNX, the gate and the flatbuffer reader.
_EXPORTS = {
    "bnnexport.converters.errors": ("ConversionMismatchError", "ConverterError",
                                    "FloatFallbackError", "InvalidModelError",
                                    "UnsupportedOpError", "ZeroSignError"),
    "bnnexport.converters.flatbuffer": ("op_histogram",),
    "bnnexport.converters.gate": ("GateOptions", "GateReport", "compare_outputs"),
    "bnnexport.converters.gate.checks": ("Reference",),
    "bnnexport.converters.lce": ("ConversionResult", "ConvertOptions", "convert_onnx"),
    "bnnexport.converters.normalize": ("NormalizeReport",),
    "bnnexport.converters.patterns": ("BinaryLayerMatch", "find_binary_layers"),
    "bnnexport.converters.runtimes": ("RuntimeModel", "open_model", "run_lce", "run_onnx",
                                      "run_tflite"),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'bnnexport.converters' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])


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
    "compare_outputs",
    "convert_onnx",
    "find_binary_layers",
    "op_histogram",
    "open_model",
    "run_lce",
    "run_onnx",
    "run_tflite",
    "ZeroSignError",
]
