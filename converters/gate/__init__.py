"""The conversion gate: is a converted model binary where meant, and its reference up to rounding?

- `predicate`: `validate`, the one fidelity predicate (plain comparison, sign-tie replay,
  recurring values), with `GateOptions`, `GateReport`, `Replay`, `Witness`, `SignProbe`;
- `agreement`: the plain comparison (`compare_outputs`, `Agreement`, `RTOL`);
- `probe`: ONNX Runtime as a `SignProbe` (`OnnxProbe`);
- `inconclusive`: telling a degenerate model from a wrong conversion;
- `twin`: the exact-grid twin, the rounding-free copy of a graph;
- `fallbacks`: no silent float, every layer meant to be binary an `LceBconv2d` or named with
  its reason (`lookalike_layers`, `grouped_refusals`, `unrecognised_layers`, `float_fallbacks`,
  `refuse_fallbacks`);
- `checks`: the checks a conversion must pass, in order (`check_conversion`);
- `quantized`: the checks of an int8 conversion (`check_int8`): its float layers int8 ops, the
  same quantized model as its QDQ reference within one step per int8 tensor (`QuantProbe`),
  the int8-io copy, the accuracy against the float model.

In: the ONNX model (the original file as the reference, the normalised graph for the witnesses
and the twin), the translator's flatbuffers (`converters.translate.Translated`), the samples and
any extra `Reference` (PyTorch, from bnnexport). Out: `GateReport`s, one per comparison, or a
one-line refusal (`ConversionMismatchError`, `FloatFallbackError`, `ZeroSignError`,
`InconclusiveCheckError`). It writes nothing; `converters.lce` keeps the flatbuffer only after it.

docs/ARCHITECTURE.md ("Conversion gate") gives the reasoning.

Example:
    >>> import numpy as np
    >>> from bnnexport.converters.gate import GateOptions, validate
    >>> ref = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
    >>> validate(ref, ref + 1e-6, np.zeros((2, 1)), GateOptions()).argmax_agreement
    1.0
"""

from bnnexport.converters.gate.agreement import RTOL, Agreement, compare_outputs
from bnnexport.converters.gate.inconclusive import TRUST_TWIN, inconclusive, near_zero_census
from bnnexport.converters.gate.predicate import (
    TIE_RTOL,
    GateOptions,
    GateReport,
    Replay,
    SignProbe,
    Witness,
    mismatch_diagnostics,
    signbit_negative,
    validate,
)
from bnnexport.converters.gate.probe import OnnxProbe

__all__ = [
    "RTOL",
    "TIE_RTOL",
    "TRUST_TWIN",
    "Agreement",
    "GateOptions",
    "GateReport",
    "OnnxProbe",
    "Replay",
    "SignProbe",
    "Witness",
    "compare_outputs",
    "inconclusive",
    "mismatch_diagnostics",
    "near_zero_census",
    "signbit_negative",
    "validate",
]
