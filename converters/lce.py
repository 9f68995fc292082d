"""ONNX file -> Larq Compute Engine flatbuffer (and optionally a float TFLite), with the gate.

`convert_onnx` translates the ONNX model to a TensorFlow SavedModel (`converters.onnx_to_tf`),
converts it with LCE's converter (target "arm" for both arm64 and arm32: they differ only in the
file name), then runs the flatbuffer in LCE's interpreter and ONNX Runtime on the same inputs.
The flatbuffer is written to a temporary file and renamed into place only when the gate passes,
so a failed conversion never leaves a flatbuffer behind. A sample on which the runtimes part
at a float-rounding tie of a binarization's input passes when choosing that sign the other way
in ONNX Runtime reproduces the flatbuffer's output (`converters.ties`, which reads LCE's own
signs from an `LceWitness`); such samples are listed.

Example:
    >>> from converters.lce import convert_onnx
    >>> result = convert_onnx("run/model.onnx", "run/model-arm64.tflite")   # doctest: +SKIP
    >>> result.lce_bconv2d, result.binary_layers, result.argmax_agreement    # doctest: +SKIP
    (4, 4, 1.0)
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from converters.errors import ConverterError
from converters.graph import load_onnx
from converters.ties import validate_with_ties
from converters.validate import (
    lce_interpreter,
    op_histogram,
    run_lce,
    run_onnx,
    run_tflite,
    signature_outputs,
)

TARGETS = ("arm64", "arm32")
RANDOM_SAMPLES = 16
FLOAT_CHECK_SAMPLES = 100  # the float TFLite model is a side product: a quicker check


@dataclass
class ConversionResult:
    """What `convert_onnx` wrote and measured."""

    output: Path
    target: str
    binary_layers: int
    lce_bconv2d: int
    float_conv2d: int
    fully_connected: int
    op_histogram: dict[str, int]
    argmax_agreement: float
    max_abs_diff: float
    tolerance: float
    samples: int
    random_inputs: bool
    onnx_bytes: int
    lce_bytes: int
    tflite_float_bytes: int = 0
    float_output: Path | None = None
    float_max_abs_diff: float | None = None
    seconds: float = 0.0
    binary_emitted: list[str] = field(default_factory=list)
    sign_ties: list[int] = field(default_factory=list)  # samples a sign tie explains
    sign_tie_largest: float = 0.0  # largest |x| / max |x| at a tie whose sign was chosen
    # the gate's own outputs on `inputs`, for callers that compare further (no second run)
    onnx_outputs: np.ndarray | None = field(default=None, repr=False)
    lce_outputs: np.ndarray | None = field(default=None, repr=False)


class LceWitness:
    """The model converted again with every binarization's input as an extra output, run in
    LCE's interpreter: a `converters.ties.Witness` of what the flatbuffer binarizes.

    The extra outputs can stop LCE fusing a bconv with the binarization after it, so the
    witness is not the shipped flatbuffer; `explain_by_ties` uses it only on samples where
    its logits match the shipped flatbuffer's.
    """

    def __init__(self, model: onnx.ModelProto):
        from converters.onnx_to_tf import save_saved_model
        from converters.tf_ops import tf

        tf()
        import larq_compute_engine as lce

        with tempfile.TemporaryDirectory(prefix="bnnexport-witness-") as tmp:
            info = save_saved_model(model, Path(tmp) / "saved", witness=True)
            flatbuffer = lce.convert_saved_model(str(Path(tmp) / "saved"), target="arm")
        self.interpreter = lce_interpreter(flatbuffer)
        order = signature_outputs(flatbuffer)
        self.logits_at = order.index("output_0")
        self.sources = {
            order.index(f"witness_{k:03d}"): source for k, source in enumerate(info.witness_sources)
        }

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(logits, binarization inputs by ONNX source) for one sample (C, H, W)."""
        outputs = self.interpreter.interpreter.predict([x[None].astype(np.float32)])
        witnessed = {source: outputs[at][0] for at, source in self.sources.items()}
        return outputs[self.logits_at][0], witnessed


def _write_temp(directory: Path, payload: bytes, suffix: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".convert-", suffix=suffix, dir=directory)
    with os.fdopen(fd, "wb") as handle:
        handle.write(payload)
    return Path(name)


def random_inputs(shape: list[int], samples: int = RANDOM_SAMPLES, seed: int = 0) -> np.ndarray:
    """Standard-normal inputs of the model's input shape (batch replaced by `samples`)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((samples, *shape[1:])).astype(np.float32)


def convert_onnx(
    onnx_path: str | Path,
    output_path: str | Path,
    target: str = "arm64",
    write_float_tflite: str | Path | None = None,
    inputs: np.ndarray | None = None,
    rtol: float = 1e-4,
) -> ConversionResult:
    """Convert an ONNX BNN to an LCE flatbuffer and check it against ONNX Runtime.

    Args:
        onnx_path: the ONNX model (NCHW input, as torch exports it).
        output_path: where the LCE flatbuffer goes (only if the gate passes).
        target: "arm64" or "arm32"; both use LCE's target "arm".
        write_float_tflite: also write the float TFLite model there (stock interpreter) and
            check it; it is always built in memory, for its size.
        inputs: NCHW float32 samples for the gate; random normal ones when None. The float
            TFLite model, a side product, is checked on the first 100 of them.
        rtol: tolerance on max |diff| as a fraction of the reference output range.

    Raises:
        InvalidModelError, UnsupportedOpError (exit 2); ConversionMismatchError (exit 1).
    """
    if target not in TARGETS:
        raise ConverterError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    start = time.perf_counter()
    onnx_path, output_path = Path(onnx_path), Path(output_path)
    model = load_onnx(onnx_path)

    from converters.onnx_to_tf import save_saved_model
    from converters.tf_ops import tf

    tf()  # first, so TensorFlow's start-up log lines are discarded
    import larq_compute_engine as lce

    with tempfile.TemporaryDirectory(prefix="bnnexport-saved-") as tmp:
        info = save_saved_model(model, Path(tmp) / "saved")
        flatbuffer = lce.convert_saved_model(str(Path(tmp) / "saved"), target="arm")
        # the float model is always built: its size is what the LCE file is compared with
        converter = tf().lite.TFLiteConverter.from_saved_model(str(Path(tmp) / "saved"))
        float_flatbuffer = converter.convert()

    is_random = inputs is None
    if inputs is None:
        inputs = random_inputs(info.input_shapes[0])
    reference = run_onnx(onnx_path, inputs)
    temp = _write_temp(output_path.parent, flatbuffer, ".tflite")
    float_temp = None
    try:
        lce_outputs = run_lce(temp, inputs)
        agreement, ties = validate_with_ties(
            onnx_path, inputs, reference, lce_outputs, rtol, "LCE flatbuffer",
            witness=lambda: LceWitness(model),
        )  # fmt: skip
        float_diff = None
        if write_float_tflite is not None:
            float_temp = _write_temp(Path(write_float_tflite).parent, float_flatbuffer, ".tflite")
            few = slice(0, FLOAT_CHECK_SAMPLES)
            float_check, _ = validate_with_ties(
                onnx_path, inputs[few], reference[few], run_tflite(float_temp, inputs[few]),
                rtol, "float TFLite model",
            )  # fmt: skip
            float_diff = float_check.max_abs_diff
            os.replace(float_temp, write_float_tflite)
        os.replace(temp, output_path)
    finally:
        for leftover in (temp, float_temp):
            if leftover is not None and leftover.exists():
                leftover.unlink()

    histogram = op_histogram(flatbuffer)
    return ConversionResult(
        output=output_path,
        target=target,
        binary_layers=info.binary_layers,
        lce_bconv2d=histogram.get("LceBconv2d", 0),
        float_conv2d=histogram.get("CONV_2D", 0) + histogram.get("DEPTHWISE_CONV_2D", 0),
        fully_connected=histogram.get("FULLY_CONNECTED", 0),
        op_histogram=histogram,
        argmax_agreement=agreement.argmax_agreement,
        max_abs_diff=agreement.max_abs_diff,
        tolerance=agreement.tolerance,
        samples=agreement.samples,
        random_inputs=is_random,
        onnx_bytes=onnx_path.stat().st_size,
        lce_bytes=len(flatbuffer),
        tflite_float_bytes=len(float_flatbuffer),
        float_output=Path(write_float_tflite) if write_float_tflite is not None else None,
        float_max_abs_diff=float_diff,
        seconds=time.perf_counter() - start,
        binary_emitted=info.binary_emitted,
        sign_ties=ties.rows,
        sign_tie_largest=ties.largest_tie,
        onnx_outputs=reference,
        lce_outputs=lce_outputs,
    )
