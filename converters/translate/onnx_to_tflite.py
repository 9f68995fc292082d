"""An ONNX model through the translator and the converters: the LCE flatbuffer and, when asked,
the stock TFLite converter's float flatbuffer, with the memory TensorFlow leaves behind released
between the steps. Each flatbuffer declares its input layout in its metadata from the start
(`converters.flatbuffer.input_layout`), so whatever runs it, the gate first, feeds that layout.

Example:
    >>> from bnnexport.converters.translate import translate
    >>> translated = translate(model, float_model=True)                 # doctest: +SKIP
    >>> len(translated.flatbuffer) < len(translated.float_flatbuffer)   # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from bnnexport.converters.flatbuffer import binarize_int8_directly, layout_metadata, with_metadata
from bnnexport.converters.runtimes import tf
from bnnexport.converters.translate.onnx_to_tf import TranslationInfo

# A full collection costs about half a second once TensorFlow is loaded; below this model size
# the leftovers it would free are small too.
RELEASE_ABOVE_BYTES = 32 << 20


def release_memory(model_bytes: int) -> None:
    """For a model of `model_bytes` (at least `RELEASE_ABOVE_BYTES`): collect TensorFlow's
    reference cycles and hand freed heap back to the OS.

    Building and saving a `tf.function` leaves its graph (the model's constants, ~1x-10x the
    ONNX file) in reference cycles that only `gc.collect()` frees, and glibc keeps freed
    memory in its arenas until `malloc_trim`; without both, every conversion of a large model
    starts on top of the last one's leftovers (docs/LCE_NOTES.md "Conversion memory")."""
    if model_bytes < RELEASE_ABOVE_BYTES:
        return
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass


@contextlib.contextmanager
def releasing(model_bytes: int) -> Iterator[None]:
    """`release_memory(model_bytes)` when the block ends, however it ends: around each step
    that leaves a copy of the model's constants behind."""
    try:
        yield
    finally:
        release_memory(model_bytes)


@dataclass
class Translated:
    """The LCE flatbuffer, the float flatbuffer (None when not asked for) and what the
    translator saw (`TranslationInfo`: with `witness`, the sources of the extra outputs)."""

    flatbuffer: bytes
    float_flatbuffer: bytes | None
    info: TranslationInfo
    # with `int8_io`: the same conversion with int8 input and output (no QUANTIZE at the
    # start, no DEQUANTIZE at the end), for a model whose float layers run in int8
    int8_io_flatbuffer: bytes | None = None
    # where the time went: "translate" (tracing the tf.function and saving the SavedModel),
    # "lce_converter", and "tflite_converter" when the float model was built
    seconds: dict[str, float] = field(default_factory=dict)
    # the LceQuantize ops LCE's converter left reading a DEQUANTIZE of an int8 tensor, rewired
    # to read the int8 tensor (`lce_flatbuffer`)
    int8_binarizations_rewired: int = 0

    @property
    def input_layout(self) -> str | None:
        """How the flatbuffers take the image input ("nhwc", "nchw"; None: no image input)."""
        return self.info.input_layout


def translate(
    model: onnx.ModelProto,
    float_model: bool,
    witness: bool = False,
    int8_io: bool = False,
    input_layout: str = "nchw",
) -> Translated:
    """Translate `model` to a SavedModel (`converters.translate.onnx_to_tf`: its image inputs
    taken in `input_layout`, with every binarization's input and int8 activation as an extra
    output when `witness`) and convert it with LCE (target "arm"; every binarization of an int8
    tensor reading it as int8: `lce_flatbuffer`), with `int8_io` also with int8 input and output
    types, and, with `float_model`, the stock TFLite converter. Every flatbuffer declares its
    input layout in its metadata."""
    from bnnexport.converters.translate.onnx_to_tf import save_saved_model

    import_tensorflow_and_lce()  # its time is no stage of the translation's
    size = model.ByteSize()
    clock = {"translate": -time.perf_counter()}
    with tempfile.TemporaryDirectory(prefix="bnnexport-saved-") as tmp:
        saved = str(Path(tmp) / "saved")
        with releasing(size):  # the traced graph, before the converter copies the model again
            info = save_saved_model(model, saved, witness=witness, input_layout=input_layout)
        clock["translate"] += time.perf_counter()
        clock["lce_converter"] = -time.perf_counter()
        with releasing(size):
            flatbuffer, rewired = lce_flatbuffer(saved)
        int8_flatbuffer = None
        if int8_io:
            int8_flatbuffer, _ = lce_flatbuffer(saved, int8_io=True)
        clock["lce_converter"] += time.perf_counter()
        float_flatbuffer = None
        if float_model:
            clock["tflite_converter"] = -time.perf_counter()
            float_flatbuffer = _float_tflite(saved, size)
            clock["tflite_converter"] += time.perf_counter()
    declared = layout_metadata(info.input_layout)
    flatbuffer, float_flatbuffer, int8_flatbuffer = (
        with_metadata(f, declared) if f is not None and declared else f
        for f in (flatbuffer, float_flatbuffer, int8_flatbuffer)
    )
    return Translated(flatbuffer, float_flatbuffer, info, int8_flatbuffer, clock, rewired)


def import_tensorflow_and_lce() -> None:
    """Import TensorFlow (through `tf`, so its start-up log lines are discarded) and LCE's
    converter: seconds on first use, nothing after (`ConversionResult.stage_seconds`'s
    "import")."""
    tf()
    import larq_compute_engine  # noqa: F401


def lce_flatbuffer(saved: str, int8_io: bool = False) -> tuple[bytes, int]:
    """LCE's converter on a SavedModel (target "arm"; with `int8_io`, int8 input and output),
    every binarization of an int8 tensor then reading it as int8: the flatbuffer and how many
    `LceQuantize` ops were rewired so.

    LCE's converter binarizes an int8 tensor as int8 when the binarization is its only reader;
    when a float op reads it too (the residual ADD after Bi-Real-Net's and QuickNet's int8
    stems and shortcut convs), it writes one DEQUANTIZE and has the `LceQuantize` read that
    float copy, whose zero point LCE's ARM build makes a residue of about 1e-9 that may
    binarize to -1 (docs/LCE_NOTES.md "int8 around binary layers", "int8 on ARM").
    `binarize_int8_directly` rewires those `LceQuantize` ops to the int8 tensor, whose zero
    point binarizes to +1 on every runtime."""
    import larq_compute_engine as lce

    types = {"inference_input_type": tf().int8, "inference_output_type": tf().int8}
    converted = lce.convert_saved_model(saved, target="arm", **(types if int8_io else {}))
    return binarize_int8_directly(converted)


def _float_tflite(saved: str, model_bytes: int) -> bytes:
    """The stock TFLite converter on a SavedModel. `from_saved_model` loads the whole model
    into Python only to read its signatures and drops it into reference cycles: collect it
    before the converter reads the model again (docs/LCE_NOTES.md "Conversion memory")."""
    with releasing(model_bytes):
        converter = tf().lite.TFLiteConverter.from_saved_model(saved)
    with releasing(model_bytes):
        flatbuffer = converter.convert()
        del converter
    return flatbuffer
