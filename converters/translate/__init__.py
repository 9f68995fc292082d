"""The translator: a normalised ONNX BNN -> TensorFlow (NHWC) -> LCE and float TFLite flatbuffers.

In: an ONNX `ModelProto` as `converters.normalize` leaves it (NCHW, static shapes, every
binarization in its canonical form). Out: `Translated`, the LCE flatbuffer's bytes, the float
TFLite flatbuffer's bytes when asked for, each declaring its input layout in its metadata, and
`TranslationInfo` (the binary layers it emitted, the input shapes and layout, with `witness` the
sources of the extra outputs). Nothing is written to disk but a temporary SavedModel; checking
the result is the gate's (`converters.gate`).

- `onnx_to_tflite`: `translate`, the whole room in one call, TensorFlow's memory released
  between its steps (`releasing`, `release_memory`);
- `worker`: a translation in a second process (`in_background`, `TranslationWorker`), which
  the gate starts for the exact-grid twin while the model itself is translated;
- `onnx_to_tf`: ONNX -> a `tf.Module` in NHWC, saved as a SavedModel (`save_saved_model`,
  `build_module`);
- `coverage`: the ops it takes (`SUPPORTED`), and for a graph with one it does not, the first
  such node with its PyTorch module and the nearest spelling that converts
  (`first_unsupported`);
- `tf_layers`, `tf_elementwise`: the op handlers (`HANDLERS`), layers and the rest;
- `tf_quantized`: the int8 handlers (QuantizeLinear/DequantizeLinear as fake quantization,
  dense layers on int8 inputs as 1x1 convs), for the QDQ models of `converters.quantize`;
- `tf_ops`: the TensorFlow forms LCE recognises, and what a handler may use of the translator;
- `values`: a translated tensor (`Value`, its `Layout`) and the affine maps over a binary
  conv's accumulator;
- `padding`, `groups`: plain-Python decisions (a binary conv's padding, a grouped binary conv's
  plan: `plan_binary_groups`, which the gate reads too).

May import: `converters.errors`, `converters.graph`, `converters.patterns`,
`converters.layer_map`, `converters.runtimes` (TensorFlow through `tf`),
`converters.flatbuffer` (LCE's flatbuffer read back, its int8 binarizations rewired, the
metadata declaring the input layout), and onnx, numpy, TensorFlow, LCE. Never the gate, the
normaliser, `converters.lce` or `converters.batch`, which sit above it (`tests/test_imports.py`).

Example:
    >>> from bnnexport.converters.translate import translate
    >>> translated = translate(model, float_model=True)                 # doctest: +SKIP
    >>> translated.info.binary_layers == len(translated.info.binary_emitted)  # doctest: +SKIP
    True
"""

from __future__ import annotations

from bnnexport.converters.translate.coverage import SUPPORTED, first_unsupported
from bnnexport.converters.translate.groups import GroupPlan, plan_binary_groups
from bnnexport.converters.translate.onnx_to_tf import (
    TranslationInfo,
    build_module,
    image_inputs,
    save_saved_model,
)
from bnnexport.converters.translate.onnx_to_tflite import (
    Translated,
    import_tensorflow_and_lce,
    release_memory,
    releasing,
    translate,
)

__all__ = [
    "SUPPORTED",
    "GroupPlan",
    "Translated",
    "TranslationInfo",
    "build_module",
    "first_unsupported",
    "image_inputs",
    "import_tensorflow_and_lce",
    "plan_binary_groups",
    "release_memory",
    "releasing",
    "save_saved_model",
    "translate",
]
