"""ONNX file -> Larq Compute Engine flatbuffer (and optionally a float TFLite), with the gate.

`convert_onnx` normalises the ONNX graph (`converters.normalize`), translates it to a TensorFlow
SavedModel and converts that with LCE's converter (`converters.translate`; target "arm" for both
arm64 and arm32: they differ only in the file name), and keeps the flatbuffer only when

1. every binary layer of the ONNX graph became an `LceBconv2d` (else `FloatFallbackError`,
   unless the layer is in `allow_float`), and no layer merely looks binary (a ±1 kernel behind a
   plain `Sign`, which maps 0 to 0): `converters.gate.fallbacks`;
2. the gate's checks pass (`converters.gate.checks.check_conversion`: LCE and the float TFLite
   model against ONNX Runtime and every extra `Reference`, and the exact-grid twin).

The result records what LCE's interpreter must be told to run the flatbuffer (`lce_settings`:
empty when LCE's default kernels, an app's default, run it; the gate itself runs indirect
BGEMM, which runs every flatbuffer LCE writes).

It converts at the ONNX file's batch (a dynamic one becomes 1); `converters.batch` converts at
batch N, through this same function. An image input (rank 4, NCHW in the ONNX file) is taken in
`ConvertOptions.input_layout`, by default the target's (`DEFAULT_INPUT_LAYOUT`: NHWC, what a
device app feeds); the flatbuffer's metadata declares it, and the check samples, NCHW, are put
in it where they meet a flatbuffer (docs/LCE_NOTES.md "Input layout").

The flatbuffer is written to a temporary file and renamed into place only at the end, so a
failed conversion never leaves one behind.

Example:
    >>> from bnnexport.converters.lce import convert_onnx
    >>> result = convert_onnx("run/model.onnx", "run/model-arm64.tflite")   # doctest: +SKIP
    >>> result.lce_bconv2d, result.binary_layers, result.gates[0].argmax_agreement  # doctest: +SKIP
    (4, 4, 1.0)
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from bnnexport.converters.choices import (
    INPUT_LAYOUTS,
    LAYER_PRECISIONS,
    TARGETS,
    InputLayout,
    LayerPrecision,
    Target,
)
from bnnexport.converters.errors import ConverterError
from bnnexport.converters.flatbuffer import (
    flatbuffer_ops,
    input_layout,
    input_shapes,
    op_histogram,
    with_metadata,
)
from bnnexport.converters.gate import GateOptions, GateReport
from bnnexport.converters.gate.checks import (
    Checked,
    Reference,
    StartedTwin,
    check_conversion,
    start_twin,
)
from bnnexport.converters.gate.fallbacks import (
    RecordedLayer,
    fallback_reasons,
    grouped_refusals,
    lookalike_layers,
    refuse_fallbacks,
    refuse_unknown_layers,
    transposed_refusals,
    unrecognised_layers,
)
from bnnexport.converters.gate.quantized import check_int8
from bnnexport.converters.graph import OnnxGraph, load_onnx
from bnnexport.converters.normalize import NormalizeReport, normalize, runnable_reference
from bnnexport.converters.patterns import find_binary_layers_in
from bnnexport.converters.quantize import Quantized, QuantPoint, quantize
from bnnexport.converters.runtimes import lce_kernel_settings, run_lce
from bnnexport.converters.translate import (
    Translated,
    first_unsupported,
    image_inputs,
    import_tensorflow_and_lce,
    translate,
)
from bnnexport.converters.translate.worker import TranslationWorker, shared_worker, worthwhile

# how an image input is taken when not asked: TFLite's convention, what an app on an ARM device
# feeds (camera frames are HWC), on both targets: they are one LCE target, "arm", and the same
# TFLite apps (docs/LCE_NOTES.md "Input layout")
DEFAULT_INPUT_LAYOUT = {"arm64": "nhwc", "arm32": "nhwc"}
RANDOM_SAMPLES = 16
# `ConversionResult.stage_seconds`, in order, adding up to `seconds`: the normaliser and the
# checks before TensorFlow; TensorFlow's and LCE's import on first use (0 when imported before:
# a one-time cost of the process, which a native Keras conversion pays before it starts too);
# tracing the translated tf.function and saving it; LCE's converter; the stock TFLite converter
# (only with a float model asked for); the gate's comparisons (with any witness conversion and
# tie replay) and the writing; the exact-grid twin (its translation, conversion and comparison)
STAGES = ("normalise", "import", "translate", "lce_converter", "tflite_converter", "gate", "twin")


@dataclass
class ConversionResult:
    """What `convert_onnx` wrote and measured. `gates` holds one `GateReport` per comparison
    (LCE vs ONNX Runtime first, then each reference, then the float TFLite model); `twin` the
    exact-grid twin's."""

    output: Path
    target: Target
    binary_layers: int
    lce_bconv2d: int
    float_conv2d: int  # CONV_2D and DEPTHWISE_CONV_2D reading float32
    fully_connected: int
    op_histogram: dict[str, int]
    samples: int
    random_inputs: bool
    batch: int  # the batch the flatbuffer takes
    onnx_bytes: int
    lce_bytes: int
    # how the flatbuffer takes its image input, as its metadata declares it ("nhwc", "nchw";
    # None: the model has no NCHW image input and is taken as the ONNX model takes it), and
    # its input shape in that layout
    input_layout: InputLayout | None = None
    input_shape: list[int] = field(default_factory=list)
    tflite_float_bytes: int | None = None  # None: no float model asked for, none built
    float_output: Path | None = None
    seconds: float = 0.0
    gates: list[GateReport] = field(default_factory=list)
    twin: list[GateReport] = field(default_factory=list)
    float_fallbacks: list[str] = field(default_factory=list)
    normalized: NormalizeReport = field(default_factory=NormalizeReport)
    # with `trust_twin`: why the real-weight check was inconclusive (None: it decided)
    trusted_twin: dict | None = None
    # what LCE's interpreter must be told to run the flatbuffer besides its defaults (empty:
    # an app's default interpreter runs it; `converters.runtimes.lce_kernel_settings`)
    lce_settings: dict[str, bool] = field(default_factory=dict)
    # with float_layers "int8": the int8 census and checks (`converters.gate.quantized.check_int8`)
    int8: dict | None = None
    int8_conv2d: int = 0  # CONV_2D and DEPTHWISE_CONV_2D reading int8
    # where `seconds` went, stage by stage (`STAGES`; docs/BENCHMARKS.md "Conversion time")
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def gate(self, reference: str, candidate: str = "LCE") -> GateReport | None:
        """The gate report comparing `candidate` with `reference`, if that check ran."""
        return next(
            (g for g in self.gates if (g.reference, g.candidate) == (reference, candidate)), None
        )


def _write_temp(directory: Path, payload: bytes, suffix: str) -> Path:
    """`payload` in a new `.convert-XXXX` file of `directory`, created with mode 0666 so the
    kernel applies the umask, as for every other file bnnexport writes (mkstemp's 0600 would
    leave the flatbuffers alone unreadable to others; docs/ARCHITECTURE.md "Run directory")."""
    directory.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        path = directory / f".convert-{secrets.token_hex(6)}{suffix}"
        try:
            fd = os.open(path, flags, 0o666)
        except FileExistsError:  # a name drawn twice: draw again
            continue
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        return path


def random_inputs(shape: list[int], samples: int = RANDOM_SAMPLES, seed: int = 0) -> np.ndarray:
    """Standard-normal inputs of the model's input shape (batch replaced by `samples`)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((samples, *shape[1:])).astype(np.float32)


@dataclass(frozen=True)
class ConvertOptions:
    """How `convert_onnx` checks: the gate's thresholds, the layers allowed to stay float
    (names, or "all"), whether to convert the exact-grid twin, and normaliser passes to skip
    (`converters.normalize.REWRITES`). The batch is the ONNX file's (a dynamic one becomes 1);
    `converters.batch.convert_batched` converts at another."""

    gate: GateOptions = GateOptions()
    allow_float: tuple[str, ...] = ()
    twin: bool = True
    # translate the twin in a second process while the model itself is translated and checked
    # (`converters.translate.worker`); None: where it pays (`worker.worthwhile`: the model's
    # size, a second core, the memory); the result is the same either way, only sooner
    twin_worker: bool | None = None
    disabled_rewrites: tuple[str, ...] = ()
    # convert a model the real-weight check cannot decide (InconclusiveCheckError) when the
    # exact-grid twin passes; the result's `trusted_twin` records it
    trust_twin: bool = False
    # the binary layers (binary kernel, binarized input) the model itself has, as its
    # framework recorded them (empty: unknown). A graph showing fewer lost a binarization the
    # normaliser does not recognise, and that layer would stay float: refused like a
    # fallback, naming each lost layer and why (`converters.gate.fallbacks.unrecognised_layers`)
    recorded_layers: tuple[RecordedLayer, ...] = ()
    # called with a short line as each step starts (a progress display); None: silent
    on_step: Callable[[str], None] | None = None
    # "int8": the float layers run in int8, calibrated on `calibration` (default: the check
    # samples) unless the model carries its own ranges; the gate then compares with the int8
    # model in ONNX Runtime (`converters.quantize`, `converters.gate.quantized`)
    float_layers: LayerPrecision = "float32"
    calibration: np.ndarray | None = field(default=None, compare=False)
    # int8: the activation points to use (`QuantizeReport.tensor_points` of another
    # conversion of the same model: a batch-N copy takes the batch-1 model's)
    int8_points: dict[str, dict] | None = field(default=None, compare=False)
    # int8: refuse a model whose top-1 on labelled samples is more than this many points
    # below the float model's (None: no limit)
    max_accuracy_drop: float | None = 1.0
    # int8: the flatbuffer's input and output types ("int8": no QUANTIZE / DEQUANTIZE at the ends)
    io: LayerPrecision = "float32"
    # entries added to the flatbuffer's metadata after every check (name -> bytes: what an
    # app on the device reads, e.g. bnnexport's class names); `converters.flatbuffer`
    metadata: dict[str, bytes] = field(default_factory=dict, compare=False)
    # how an image input is taken: "nhwc" or "nchw" (`INPUT_LAYOUTS`); None: the target's
    # (`DEFAULT_INPUT_LAYOUT`). Given for a model with no NCHW image input: refused
    input_layout: InputLayout | None = None

    def step(self, line: str) -> None:
        """Report that the step `line` starts (to `on_step`, when there is one)."""
        if self.on_step is not None:
            self.on_step(line)


def convert_onnx(
    onnx_path: str | Path,
    output_path: str | Path,
    target: Target = "arm64",
    write_float_tflite: str | Path | None = None,
    inputs: np.ndarray | None = None,
    options: ConvertOptions = ConvertOptions(),
    references: Sequence[Reference] = (),
    labels: np.ndarray | None = None,
) -> ConversionResult:
    """Convert an ONNX BNN to an LCE flatbuffer, kept only when the gate passes (module doc).

    Args:
        onnx_path: the ONNX model (NCHW input, as torch exports it).
        output_path: where the LCE flatbuffer goes (only if every check passes).
        target: "arm64" or "arm32"; both use LCE's target "arm".
        write_float_tflite: also write the float TFLite model there (stock interpreter) and
            check it; it is always built in memory, for its size.
        inputs: NCHW float32 samples for the gate; random normal ones when None. The float
            TFLite model, a side product, is checked on the first 100 of them.
        options: the gate's thresholds, allowed float layers, the twin check; with
            `float_layers` "int8" the int8 conversion (`converters.gate.quantized.check_int8`).
        references: models besides ONNX Runtime the flatbuffer must match (PyTorch; with
            int8, none: the int8 model is checked against its own quantized reference).
        labels: class indices of `inputs` (-1 for none), for an int8 model's top-1 against
            the float model's.

    Raises:
        InvalidModelError, UnsupportedOpError (exit 2); ConversionMismatchError,
        FloatFallbackError (exit 1).
    """
    if target not in TARGETS:
        raise ConverterError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    _check_int8_options(options, write_float_tflite)
    start = time.perf_counter()
    onnx_path, output_path = Path(onnx_path), Path(output_path)
    worker = _twin_worker(onnx_path, options)  # started first: it imports while we normalise
    normal = _normalise(onnx_path, options, target)
    samples = inputs if inputs is not None else random_inputs(_input_shape(normal.model))
    job = _Job(onnx_path, target, write_float_tflite, samples, inputs is None, labels,
               references, options, start)  # fmt: skip
    quantized = _quantized(normal.model, job.inputs, options)
    started = start_twin(normal.model, normal.layout, worker) if worker else None
    try:
        translated, stage_seconds = _translate(normal, quantized, job)
        gated = _gated(normal, translated, quantized, job, started)
    finally:
        if started is not None:  # a refusal before the twin: the worker's work is not wanted
            started.translation.cancel()
    float_flatbuffer = translated.float_flatbuffer or b""
    written = _write_all(output_path, gated.flatbuffer, write_float_tflite, float_flatbuffer)
    # the gate: from the translator's end to the written flatbuffer, the twin apart
    stage_seconds["gate"] = time.perf_counter() - start - sum(stage_seconds.values())
    stage_seconds["gate"] -= gated.checked.twin_seconds
    stage_seconds["twin"] = gated.checked.twin_seconds
    return _result(job, normal, translated, gated, written, stage_seconds)


@dataclass(frozen=True)
class _Job:
    """One `convert_onnx` call's arguments as its steps read them (`inputs`: the check
    samples, drawn at random when none were given: `random_inputs`), and when it started."""

    onnx_path: Path
    target: Target
    write_float_tflite: str | Path | None
    inputs: np.ndarray
    random_inputs: bool
    labels: np.ndarray | None
    references: Sequence[Reference]
    options: ConvertOptions
    start: float


@dataclass
class _Normalised:
    """The ONNX model as the translator takes it (`normalize`d) and what the later steps need
    of it: the normaliser's report, the binary layers (node names), the layers that look
    binary but would stay float (name: why; refused unless allowed float), the input layout,
    and what ONNX Runtime runs as the reference (the original file, or the runnable copy
    `runnable_reference` makes of it)."""

    model: onnx.ModelProto
    report: NormalizeReport
    binary: list[str]
    lookalikes: dict[str, str]
    layout: str
    reference: Path | bytes


def _twin_worker(onnx_path: Path, options: ConvertOptions) -> TranslationWorker | None:
    """The worker that translates the exact-grid twin (`ConvertOptions.twin_worker`), for a
    float-layer conversion that checks the twin; None: the twin is translated here."""
    if not options.twin or options.float_layers != "float32" or options.twin_worker is False:
        return None
    if options.twin_worker is None:
        try:
            size = onnx_path.stat().st_size
        except OSError:  # the normaliser says what is wrong with the path
            return None
        if not worthwhile(size):
            return None
    return shared_worker()


def _normalise(onnx_path: Path, options: ConvertOptions, target: str) -> _Normalised:
    """Load and normalise the ONNX model; refuses, before TensorFlow, what `_binary_layers`
    refuses and an input layout the model cannot take (`_input_layout`)."""
    options.step(f"normalise {onnx_path.name}")
    original = load_onnx(onnx_path)
    # everything below sees the normalised graph; ONNX Runtime runs the original file as the
    # reference, which is what shows the normaliser exact
    # a dynamic batch becomes 1; another batch is `converters.batch.convert_batched`'s, which
    # fixes it in the ONNX file before this runs
    model, normalized = normalize(original, options.disabled_rewrites)
    binary, lookalikes = _binary_layers(model, options, onnx_path)
    layout = _input_layout(model, options.input_layout, target)
    # the graph's folded constants and the original are each a copy of the weights: neither
    # outlives this function (the graph, `_binary_layers`), so both are gone before the
    # converters run (docs/LCE_NOTES.md "Conversion memory")
    reference = runnable_reference(original)
    reference_path = onnx_path if reference is None else reference.SerializeToString()
    return _Normalised(model, normalized, binary, lookalikes, layout, reference_path)


def _binary_layers(
    model: onnx.ModelProto, options: ConvertOptions, onnx_path: Path
) -> tuple[list[str], dict[str, str]]:
    """The normalised graph's binary layers (node names) and its lookalikes (layer: why).
    Refuses, before TensorFlow: a name in `allow_float` that is no such layer, a lookalike
    not allowed float (`converters.gate.fallbacks`), the first unsupported op."""
    graph = OnnxGraph.folded(model)
    binary = [m.node_name for m in find_binary_layers_in(graph) if m.binary]
    lookalikes = {**lookalike_layers(graph), **grouped_refusals(graph)}
    lookalikes.update(transposed_refusals(graph))
    lookalikes.update(unrecognised_layers(graph, options.recorded_layers, binary))
    refuse_unknown_layers(options.allow_float, [*binary, *lookalikes], onnx_path)
    refuse_fallbacks(lookalikes, options.allow_float)
    unsupported = first_unsupported(graph)  # the first in graph order
    if unsupported is not None:
        raise unsupported
    return binary, lookalikes


def _translate(
    normal: _Normalised, quantized: Quantized | None, job: _Job
) -> tuple[Translated, dict[str, float]]:
    """The translation and its LCE (and, when asked, stock TFLite) conversion, of the int8
    model when the float layers run in int8; and `ConversionResult.stage_seconds` so far (the
    normaliser's since `job.start`, the translator's)."""
    normalised = time.perf_counter()
    float_model = job.write_float_tflite is not None  # built only when asked: a second converter
    job.options.step(f"translate to TensorFlow, run the LCE{' and TFLite' * float_model} converter")
    import_tensorflow_and_lce()
    imported = time.perf_counter()
    if quantized is not None:
        translated = translate(quantized.model, float_model=False, input_layout=normal.layout,
                               int8_io=job.options.io == "int8")  # fmt: skip
    else:
        translated = translate(normal.model, float_model=float_model, input_layout=normal.layout)
    stage_seconds = {"normalise": normalised - job.start, "import": imported - normalised,
                     **translated.seconds}  # fmt: skip
    # what the translator's own clock does not hold (the metadata it adds) is its stage's
    stage_seconds["translate"] += time.perf_counter() - imported - sum(translated.seconds.values())
    return translated, stage_seconds


@dataclass
class _Gated:
    """What passed the checks: the flatbuffer to write (the int8-io copy of an int8
    conversion with int8 ends, with `ConvertOptions.metadata` added), the checks' reports,
    the int8 part of the report (None: float layers in float32), the float fallbacks allowed
    and what LCE's interpreter must be told to run it (`lce_kernel_settings`)."""

    flatbuffer: bytes
    checked: Checked
    int8: dict | None
    float_fallbacks: list[str]
    lce_settings: dict[str, bool]


def _gated(
    normal: _Normalised,
    translated: Translated,
    quantized: Quantized | None,
    job: _Job,
    started: StartedTwin | None = None,
) -> _Gated:
    """Check the translation in the module doc's order: LCE's interpreter runs it, no binary
    layer fell back to float unless allowed, then the gate (`check_conversion`, with the twin
    `started` early, or `check_int8` for an int8 conversion); raises the first refusal."""
    options, inputs = job.options, job.inputs
    flatbuffer, int8 = translated.flatbuffer, None
    kernels = lce_kernel_settings(flatbuffer)
    emitted, histogram = translated.info.binary_emitted, op_histogram(flatbuffer)
    allowed = refuse_fallbacks(
        fallback_reasons(normal.lookalikes, normal.binary, emitted, histogram), options.allow_float
    )
    if quantized is None:
        checked = check_conversion(
            onnx_path=normal.reference, model=normal.model, translated=translated,
            inputs=inputs, references=job.references, options=options,
            zero_sensitive=normal.report.zero_sensitive,
            check_float=job.write_float_tflite is not None, started_twin=started,
        )  # fmt: skip
    else:
        checked, int8 = check_int8(quantized, translated, inputs, job.labels, options)
        if translated.int8_io_flatbuffer is not None:  # what is written: the int8-io copy
            flatbuffer = translated.int8_io_flatbuffer
    if options.metadata:
        flatbuffer = _with_metadata(flatbuffer, options.metadata, inputs)
    return _Gated(flatbuffer, checked, int8, allowed, kernels.flags)


def _result(
    job: _Job,
    normal: _Normalised,
    translated: Translated,
    gated: _Gated,
    written: Path,
    stage_seconds: dict[str, float],
) -> ConversionResult:
    """What `convert_onnx` wrote (`written`) and measured."""
    flatbuffer, float_path, checked = gated.flatbuffer, job.write_float_tflite, gated.checked
    histogram = op_histogram(flatbuffer)
    convs = _convs_by_input_type(flatbuffer)
    float_flatbuffer = translated.float_flatbuffer
    return ConversionResult(
        output=written,
        target=job.target,
        binary_layers=len(normal.binary),
        lce_bconv2d=histogram.get("LceBconv2d", 0),
        float_conv2d=convs["FLOAT32"],
        int8_conv2d=convs["INT8"],
        fully_connected=histogram.get("FULLY_CONNECTED", 0),
        op_histogram=histogram,
        samples=len(job.inputs),
        random_inputs=job.random_inputs,
        batch=translated.info.input_shapes[0][0],
        onnx_bytes=job.onnx_path.stat().st_size,
        lce_bytes=len(flatbuffer),
        input_layout=input_layout(flatbuffer),
        input_shape=input_shapes(flatbuffer)[0],
        tflite_float_bytes=len(float_flatbuffer) if float_flatbuffer else None,
        float_output=Path(float_path) if float_path is not None else None,
        seconds=time.perf_counter() - job.start,
        gates=checked.gates,
        twin=checked.twin,
        float_fallbacks=gated.float_fallbacks,
        normalized=normal.report,
        trusted_twin=checked.trusted_twin,
        lce_settings=gated.lce_settings,
        int8=gated.int8,
        stage_seconds={k: round(v, 3) for k, v in stage_seconds.items()},
    )


def _with_metadata(flatbuffer: bytes, entries: dict[str, bytes], inputs: np.ndarray) -> bytes:
    """The checked flatbuffer with `entries` in its metadata, proven the same model: the same
    ops, and LCE's outputs on the first check samples bit for bit the checked one's."""
    written = with_metadata(flatbuffer, entries)
    probe = inputs[:4]
    same = op_histogram(written) == op_histogram(flatbuffer)
    if not (same and np.array_equal(run_lce(written, probe), run_lce(flatbuffer, probe))):
        raise ConverterError("internal error: adding metadata changed the flatbuffer's model")
    return written


def _input_layout(model: onnx.ModelProto, asked: str | None, target: str) -> str:
    """How the translator takes an image input: `asked`, else the target's default.
    ConverterError (exit 2) for a layout asked of a model with no NCHW image input (a flat
    input, or one already channels-last as tf2onnx writes a Keras model): it is taken as the
    ONNX model takes it, whatever the layout."""
    if asked is not None and not image_inputs(OnnxGraph(model)):
        first = OnnxGraph(model).inputs[0]
        shape = [d.dim_value or d.dim_param or "?" for d in first.type.tensor_type.shape.dim]
        raise ConverterError(
            f"--input-layout {asked}: the model has no NCHW image input (input {first.name!r} "
            f"of shape {shape} is taken as the ONNX model takes it); leave the option out"
        )
    return asked or DEFAULT_INPUT_LAYOUT[target]


def _convs_by_input_type(flatbuffer: bytes) -> dict[str, int]:
    """How many CONV_2D and DEPTHWISE_CONV_2D ops read FLOAT32 and how many INT8."""
    convs = [op for op in flatbuffer_ops(flatbuffer) if op.op_type in FLOAT_CONVS]
    int8 = sum(1 for op in convs if op.input_types[:1] == ["INT8"])
    return {"FLOAT32": len(convs) - int8, "INT8": int8}


FLOAT_CONVS = ("CONV_2D", "DEPTHWISE_CONV_2D")


def _check_int8_options(options: ConvertOptions, write_float_tflite: object) -> None:
    """ConverterError (exit 2) for int8 settings that cannot apply, and an unknown layout."""
    if options.float_layers not in LAYER_PRECISIONS:
        raise ConverterError(
            f"unknown float layer precision {options.float_layers!r}; choose one of "
            f"{', '.join(LAYER_PRECISIONS)}"
        )
    if options.io not in LAYER_PRECISIONS:
        raise ConverterError(f"unknown io type {options.io!r}; choose one of float32, int8")
    if options.float_layers == "float32" and options.io == "int8":
        raise ConverterError("int8 input and output need the float layers in int8")
    if options.float_layers == "int8" and write_float_tflite is not None:
        raise ConverterError("the float TFLite model is not written for an int8 conversion")
    if options.input_layout not in (None, *INPUT_LAYOUTS):
        raise ConverterError(
            f"unknown input layout {options.input_layout!r}; choose one of "
            f"{', '.join(INPUT_LAYOUTS)}"
        )


def _input_shape(model: onnx.ModelProto) -> list[int]:
    """The static shape of a normalised model's first input (its batch fixed)."""
    first = OnnxGraph(model).inputs[0]
    return [max(d.dim_value, 1) for d in first.type.tensor_type.shape.dim]


def _quantized(model: onnx.ModelProto, inputs: np.ndarray, options: ConvertOptions):  # noqa: ANN202
    """The int8 model of `model` (`converters.quantize.Quantized`), calibrated on
    `options.calibration` or else `inputs`; None for float layers in float32."""
    if options.float_layers != "int8":
        if any(node.op_type == "QuantizeLinear" for node in model.graph.node):
            raise ConverterError(
                "the model carries int8 ranges (QuantizeLinear -> DequantizeLinear, e.g. from "
                "quantization-aware training): convert its float layers in int8 "
                "(--float-layers int8)"
            )
        return None
    calibration = options.calibration if options.calibration is not None else inputs
    given = {t: QuantPoint(**p) for t, p in (options.int8_points or {}).items()}
    source = "given" if given else f"from {len(calibration)} samples"
    options.step(f"int8: quantize the float layers (ranges {source})")
    return quantize(model, calibration, given, int8_outputs=options.io == "int8")


def _write_all(
    output_path: Path, flatbuffer: bytes, float_path: str | Path | None, float_flatbuffer: bytes
) -> Path:
    """Write the flatbuffer (and the float model) atomically, after every check passed."""
    temps = [(_write_temp(output_path.parent, flatbuffer, ".tflite"), output_path)]
    try:
        if float_path is not None:
            float_path = Path(float_path)
            temps.append((_write_temp(float_path.parent, float_flatbuffer, ".tflite"), float_path))
        for temp, final in temps:
            os.replace(temp, final)
    finally:
        for temp, _ in temps:
            temp.unlink(missing_ok=True)
    return output_path
