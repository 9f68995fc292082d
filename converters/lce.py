"""ONNX file -> Larq Compute Engine flatbuffer (and optionally a float TFLite), with the gate.

`convert_onnx` translates the ONNX model to a TensorFlow SavedModel (`converters.onnx_to_tf`),
converts it with LCE's converter (target "arm" for both arm64 and arm32: they differ only in the
file name), and keeps the flatbuffer only when every check passes (`converters.gate`; the
checks are listed in docs/ARCHITECTURE.md, "Conversion gate"):

1. every binary layer of the ONNX graph became an `LceBconv2d` (else `FloatFallbackError`,
   unless the layer is in `allow_float`), and no layer merely looks binary (a ±1 kernel behind a
   plain `Sign`, which maps 0 to 0);
2. LCE's outputs agree with ONNX Runtime's and with every extra `Reference` (PyTorch, from
   bnnexport) on the samples, plainly or after replaying LCE's own signs (`LceWitness`) at
   bounded rounding ties;
3. the exact-grid twin of the graph (`converters.twin`) converts to a flatbuffer that agrees
   with ONNX Runtime (and each reference's own twin) with no sign tie at all;
4. the float TFLite model, when written, passes the same gate as 2.

The flatbuffer is written to a temporary file and renamed into place only at the end, so a
failed conversion never leaves one behind.

Example:
    >>> from converters.lce import convert_onnx
    >>> result = convert_onnx("run/model.onnx", "run/model-arm64.tflite")   # doctest: +SKIP
    >>> result.lce_bconv2d, result.binary_layers, result.gates[0].argmax_agreement  # doctest: +SKIP
    (4, 4, 1.0)
"""

from __future__ import annotations

import ctypes
import gc
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from converters.errors import (
    ConversionMismatchError,
    ConverterError,
    FloatFallbackError,
    ZeroSignError,
)
from converters.gate import (
    GateOptions,
    GateReport,
    OnnxProbe,
    Replay,
    SignProbe,
    Witness,
    inconclusive,
    signbit_negative,
    validate,
)
from converters.graph import Graph, attributes, load_onnx
from converters.groups import plan_binary_groups
from converters.normalize import NormalizeReport, normalize, runnable_reference
from converters.onnx_to_tf import TranslationInfo
from converters.patterns import find_binary_layers_in, find_lookalike_layers_in, sign_zeros
from converters.runtimes import lce_interpreter, ort_session, tf, tflite_interpreter
from converters.twin import exact_grid_twin, grid_inputs
from converters.validate import op_histogram, run_lce, run_onnx, run_tflite, signature_outputs

TARGETS = ("arm64", "arm32")
RANDOM_SAMPLES = 16
FLOAT_CHECK_SAMPLES = 100  # the float TFLite model is a side product: a quicker check
TWIN_SAMPLES = 16  # exact-grid twin: rounding-free, so a few samples show any translation bug
# the twin's arithmetic is exact up to float ops after the last binarization (a 7x7 average):
# bit-exact for every zoo model but QuickNet-Small (3e-7 of the range, docs/BENCHMARKS.md
# "Conversion scaling")
TWIN_RTOL = 1e-6


@dataclass
class Reference:
    """A model the flatbuffer must match besides ONNX Runtime (bnnexport passes PyTorch).

    `outputs(inputs)` runs it on the check inputs (called after ONNX Runtime has checked their
    shape); `probe` builds a `SignProbe` of it (for the tie replay);
    `twin_outputs(twin_model, twin_inputs)` runs its own exact-grid twin.
    """

    name: str
    outputs: Callable[[np.ndarray], np.ndarray]
    probe: Callable[[], SignProbe] | None = None
    twin_outputs: Callable[[onnx.ModelProto, np.ndarray], np.ndarray] | None = None


@dataclass
class ConversionResult:
    """What `convert_onnx` wrote and measured. `gates` holds one `GateReport` per comparison
    (LCE vs ONNX Runtime first, then each reference, then the float TFLite model); `twin` the
    exact-grid twin's."""

    output: Path
    target: str
    binary_layers: int
    lce_bconv2d: int
    float_conv2d: int
    fully_connected: int
    op_histogram: dict[str, int]
    samples: int
    random_inputs: bool
    onnx_bytes: int
    lce_bytes: int
    tflite_float_bytes: int = 0
    float_output: Path | None = None
    seconds: float = 0.0
    gates: list[GateReport] = field(default_factory=list)
    twin: list[GateReport] = field(default_factory=list)
    float_fallbacks: list[str] = field(default_factory=list)
    normalized: NormalizeReport = field(default_factory=NormalizeReport)
    # with `trust_twin`: why the real-weight check was inconclusive (None: it decided)
    trusted_twin: dict | None = None

    def gate(self, reference: str, candidate: str = "LCE") -> GateReport | None:
        """The gate report comparing `candidate` with `reference`, if that check ran."""
        return next(
            (g for g in self.gates if (g.reference, g.candidate) == (reference, candidate)), None
        )


class WitnessModels:
    """The model translated again with every binarization's input as an extra output, converted
    with LCE and with the stock TFLite converter: witnesses of what each flatbuffer binarizes.

    The extra outputs can stop LCE fusing a bconv with the binarization after it, so a witness
    is not the shipped flatbuffer; the gate uses it only on samples where its logits are the
    shipped flatbuffer's own. Built on first use: most conversions meet no tie.
    """

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self._flatbuffers: dict[str, bytes] | None = None
        self.sources: list[str] = []

    def _convert(self) -> dict[str, bytes]:
        if self._flatbuffers is None:
            from converters.onnx_to_tf import save_saved_model

            tf()
            import larq_compute_engine as lce

            with tempfile.TemporaryDirectory(prefix="bnnexport-witness-") as tmp:
                saved = str(Path(tmp) / "saved")
                self.sources = save_saved_model(self.model, saved, witness=True).witness_sources
                size = self.model.ByteSize()
                release_memory(size)  # as in `_translate`
                converted = lce.convert_saved_model(saved, target="arm")
                release_memory(size)
                float_converted = _float_tflite(saved, size)
                self._flatbuffers = {"LCE": converted, "float TFLite": float_converted}
        return self._flatbuffers

    def witness(self, runtime: str) -> Witness:
        """The `Witness` of "LCE" (sign-bit rule) or "float TFLite" (x < 0 rule)."""
        state: dict[str, Callable] = {}

        def run(x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
            if not state:
                state["run"] = _named_outputs(self._convert()[runtime], runtime)
            outputs = state["run"](x[None].astype(np.float32))
            by_source = {s: outputs[f"witness_{k:03d}"][0] for k, s in enumerate(self.sources)}
            return outputs["output_0"][0], by_source

        negative = signbit_negative if runtime == "LCE" else (lambda v: np.asarray(v) < 0)
        return Witness(run=run, negative=negative)


def _named_outputs(flatbuffer: bytes, runtime: str) -> Callable[[np.ndarray], dict]:
    """A runner returning a flatbuffer's outputs by signature name (LCE reorders them)."""
    if runtime == "LCE":
        order = signature_outputs(flatbuffer)
        interpreter = lce_interpreter(flatbuffer)
        return lambda x: dict(zip(order, interpreter.predict(x), strict=True))
    runner = tflite_interpreter(flatbuffer).get_signature_runner()
    return lambda x: runner(input_0=x)


# A full collection costs about half a second once TensorFlow is loaded (2 s of a 6 s
# mnist-bnn conversion); below this model size the leftovers it would free are small too.
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


@dataclass(frozen=True)
class ConvertOptions:
    """How `convert_onnx` checks: the gate's thresholds, the layers allowed to stay float
    (names, or "all"), whether to convert the exact-grid twin, the batch size fixed in place
    of a dynamic one, and normaliser passes to skip (`converters.normalize.REWRITES`)."""

    gate: GateOptions = GateOptions()
    allow_float: tuple[str, ...] = ()
    twin: bool = True
    batch: int = 1
    disabled_rewrites: tuple[str, ...] = ()
    # convert a model the real-weight check cannot decide (InconclusiveCheckError) when the
    # exact-grid twin passes; the result's `trusted_twin` records it
    trust_twin: bool = False
    # called with a short line as each step starts (a progress display); None: silent
    on_step: Callable[[str], None] | None = None

    def step(self, line: str) -> None:
        """Report that the step `line` starts (to `on_step`, when there is one)."""
        if self.on_step is not None:
            self.on_step(line)


def lookalike_layers(graph: Graph) -> dict[str, str]:
    """Layer -> why, for layers that look binary but are not: a ±1 kernel behind a plain sign
    the converter does not take as a binarization, or a binarized input with a kernel that is
    ±1 but for exact zeros (sign(w) of a weight holding zeros)."""
    found = {
        layer.node_name: (
            f"its ±1 kernel reads a plain {layer.seen}, which maps 0 to 0 (not a binarization): "
            "binarize with sign(sign(x) + 0.1) or where(x >= 0, 1, -1)"
        )
        for layer in find_lookalike_layers_in(graph)
    }
    for match in find_binary_layers_in(graph):
        zeros = sign_zeros(match)
        if zeros:
            found[match.node_name] = (
                f"its kernel is ±1 but for {zeros} exact zeros of {match.kernel.size} values "
                "(sign(w) maps 0 to 0: ternary, not binary): binarize the weight with "
                "torch.where(w >= 0, 1.0, -1.0)"
            )
    return found


def grouped_refusals(graph: Graph) -> dict[str, str]:
    """Binary layer -> why, for grouped binary convs LCE cannot run binary
    (`converters.groups.plan_binary_groups`)."""
    why = {}
    nodes = {node.name or node.output[0]: node for node in graph.nodes}
    for match in find_binary_layers_in(graph):
        node = nodes[match.node_name]
        group = int(attributes(node).get("group", 1)) if match.op_type == "Conv" else 1
        if match.binary and group > 1:
            plan = plan_binary_groups(match.kernel.shape[1] * group, group)
            if plan.kind == "refuse":
                why[match.node_name] = plan.why
    return why


def float_fallbacks(
    graph: Graph, emitted: Sequence[str], histogram: dict[str, int]
) -> dict[str, str]:
    """Layer -> why it is not an `LceBconv2d`, for every binary or binary-looking layer."""
    binary = [m.node_name for m in find_binary_layers_in(graph) if m.binary]
    known = {**lookalike_layers(graph), **grouped_refusals(graph)}
    return _fallbacks(known, binary, emitted, histogram)


def _fallbacks(
    lookalikes: dict[str, str],
    binary: Sequence[str],
    emitted: Sequence[str],
    histogram: dict[str, int],
) -> dict[str, str]:
    """`float_fallbacks` from what it needs of the graph: the reasons known before translating
    (look-alike layers, grouped convs LCE cannot run binary) and its binary layers."""
    why = dict(lookalikes)
    for name in binary:
        if name not in emitted:
            why.setdefault(name, "the translator has no binary form for the ops around it")
    if histogram.get("LceBconv2d", 0) < len(emitted):
        why["(LCE converter)"] = (
            f"LCE made {histogram.get('LceBconv2d', 0)} of the {len(emitted)} binary layers "
            "emitted an LceBconv2d"
        )
    return why


def _refuse_fallbacks(why: dict[str, str], allowed: Sequence[str]) -> list[str]:
    """The allowed fallbacks; FloatFallbackError naming every other one."""
    refused = {k: v for k, v in why.items() if "all" not in allowed and k not in allowed}
    if refused:
        listed = "; ".join(f"{k}: {v}" for k, v in refused.items())
        raise FloatFallbackError(
            f"{len(refused)} binary layer(s) would stay float: {listed} "
            "(--allow-float LAYER or --allow-float all keeps them float)"
        )
    return sorted(why)


@dataclass
class Translated:
    """A model through the translator and the converters: the LCE flatbuffer, the stock TFLite
    converter's float flatbuffer (None when not asked for) and what the translator saw."""

    flatbuffer: bytes
    float_flatbuffer: bytes | None
    info: TranslationInfo


def _translate(model: onnx.ModelProto, float_model: bool) -> Translated:
    from converters.onnx_to_tf import save_saved_model

    tf()  # first, so TensorFlow's start-up log lines are discarded
    import larq_compute_engine as lce

    with tempfile.TemporaryDirectory(prefix="bnnexport-saved-") as tmp:
        saved = str(Path(tmp) / "saved")
        info = save_saved_model(model, saved)
        size = model.ByteSize()
        release_memory(size)  # the traced graph, before the converter copies the model again
        flatbuffer = lce.convert_saved_model(saved, target="arm")
        release_memory(size)
        float_flatbuffer = None
        if float_model:
            float_flatbuffer = _float_tflite(saved, size)
    return Translated(flatbuffer, float_flatbuffer, info)


def _float_tflite(saved: str, model_bytes: int) -> bytes:
    """The stock TFLite converter on a SavedModel. `from_saved_model` loads the whole model
    into Python only to read its signatures and drops it into reference cycles: collect it
    before the converter reads the model again (docs/LCE_NOTES.md "Conversion memory")."""
    from converters.runtimes import tf

    converter = tf().lite.TFLiteConverter.from_saved_model(saved)
    release_memory(model_bytes)
    flatbuffer = converter.convert()
    del converter
    release_memory(model_bytes)
    return flatbuffer


def binarization_inputs(
    model: onnx.ModelProto, sources: Sequence[str], inputs: np.ndarray
) -> dict[str, np.ndarray]:
    """ONNX Runtime's values of tensors `sources` of `model` on `inputs` (one sample at a
    time, so a model whose batch was fixed to 1 takes any number of samples)."""
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    known = {o.name for o in probe.graph.output}
    for name in sources:
        if name not in known:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    session = ort_session(probe.SerializeToString())
    first = session.get_inputs()[0]
    batch = first.shape[0] if isinstance(first.shape[0], int) and first.shape[0] > 0 else 1
    names = list(sources)
    found: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for x in np.asarray(inputs, np.float32):  # a fixed batch gets the sample repeated
        feed = {first.name: np.repeat(x[None], batch, axis=0)}
        for name, value in zip(names, session.run(names, feed), strict=True):
            found[name].append(value[:1])
    return {n: np.stack(v) for n, v in found.items()}


def check_zero_free(
    model: onnx.ModelProto, zero_sensitive: dict[str, float], inputs: np.ndarray, what: str
) -> None:
    """ZeroSignError unless no exact 0 (or -0.0) reaches a binarization the normaliser made out
    of a plain Sign (or `x > 0`): there the original maps 0 to 0 (or -1), the flatbuffer to +1.
    Everywhere else the two are the same function, so on `inputs` they agree exactly."""
    if not zero_sensitive:
        return
    values = binarization_inputs(model, list(zero_sensitive), inputs)
    for source, value in values.items():
        zeros = np.argwhere(value.reshape(len(value), -1) == 0)
        if len(zeros):
            raise ZeroSignError(
                f"{len(zeros)} exact zero(s) reach the plain Sign of {source!r} on {what} "
                f"{int(zeros[0][0])}: it maps 0 to {zero_sensitive[source]:g}, which LCE's "
                "1-bit activations cannot hold; binarize with sign(sign(x) + 0.1) or "
                "where(x >= 0, 1, -1) (sign(0) = +1) and export again"
            )


def check_twin(
    model: onnx.ModelProto,
    inputs: np.ndarray,
    references: Sequence[Reference],
    options: GateOptions,
) -> list[GateReport]:
    """Convert the exact-grid twin of `model` and require LCE to agree with ONNX Runtime and
    each reference's own twin with no tie at all (`converters.twin`). The twin's inputs of
    binarizations made from a plain Sign are not required to be zero-free: the twin is built
    from the normalised graph, where both runtimes map 0 to +1 there, so its (common) exact
    zeros test how the translator breaks them; whether the real model meets a zero is shown
    on the real samples (`check_zero_free`)."""
    twin = exact_grid_twin(model)
    x = grid_inputs(inputs[:TWIN_SAMPLES])
    flatbuffer = _translate(twin, float_model=False).flatbuffer
    lce_out = run_lce(flatbuffer, x)
    strict = GateOptions(rtol=min(options.rtol, TWIN_RTOL))  # no probe: no replay, no tie
    names = ("ONNX Runtime twin", "LCE twin")
    reports = [validate(run_onnx(twin.SerializeToString(), x), lce_out, x, strict, names)]
    for ref in references:
        if ref.twin_outputs is not None:
            names = (f"{ref.name} twin", "LCE twin")
            reports.append(validate(ref.twin_outputs(twin, x), lce_out, x, strict, names))
    return reports


def convert_onnx(
    onnx_path: str | Path,
    output_path: str | Path,
    target: str = "arm64",
    write_float_tflite: str | Path | None = None,
    inputs: np.ndarray | None = None,
    options: ConvertOptions = ConvertOptions(),
    references: Sequence[Reference] = (),
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
        options: the gate's thresholds, allowed float layers, the twin check.
        references: models besides ONNX Runtime the flatbuffer must match (PyTorch).

    Raises:
        InvalidModelError, UnsupportedOpError (exit 2); ConversionMismatchError,
        FloatFallbackError (exit 1).
    """
    if target not in TARGETS:
        raise ConverterError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    start = time.perf_counter()
    onnx_path, output_path = Path(onnx_path), Path(output_path)
    options.step(f"normalise {onnx_path.name}")
    original = load_onnx(onnx_path)
    # everything below sees the normalised graph; ONNX Runtime runs the original file as the
    # reference, which is what shows the normaliser exact
    # every check runs one sample at a time, so the gated model has batch 1; a dynamic batch
    # fixed at another size is translated again below and must give LCE's outputs exactly
    model, normalized = normalize(original, 1, options.disabled_rewrites)
    graph = Graph(model)
    lookalikes = {**lookalike_layers(graph), **grouped_refusals(graph)}
    _refuse_fallbacks(lookalikes, options.allow_float)  # before TensorFlow
    binary = [m.node_name for m in find_binary_layers_in(graph) if m.binary]
    # the graph's folded constants and the original are each a copy of the weights: drop both
    # before the converters run (docs/LCE_NOTES.md "Conversion memory"); a rebatch loads the file
    # again
    del graph
    reference = runnable_reference(original)
    del original
    reference_path = onnx_path if reference is None else reference.SerializeToString()
    options.step("translate to TensorFlow, run the LCE and TFLite converters")
    translated = _translate(model, float_model=True)
    flatbuffer, float_flatbuffer, info = (
        translated.flatbuffer,
        translated.float_flatbuffer or b"",
        translated.info,
    )
    float_bytes = len(float_flatbuffer)
    if write_float_tflite is None:  # only its size is reported: as big as the model, let it go
        float_flatbuffer = translated.float_flatbuffer = b""
    histogram = op_histogram(flatbuffer)
    allowed = _refuse_fallbacks(
        _fallbacks(lookalikes, binary, info.binary_emitted, histogram), options.allow_float
    )
    is_random = inputs is None
    if inputs is None:
        inputs = random_inputs(info.input_shapes[0])
    options.step(f"gate: LCE against {len(references) + 1} reference(s) on {len(inputs)} samples")
    check_zero_free(model, normalized.zero_sensitive, inputs, "check sample")
    twin: list[GateReport] | None = None
    trusted = None
    try:
        gates = _gates(reference_path, model, translated, inputs, references, options,
                       write_float_tflite is not None)  # fmt: skip
    except ConversionMismatchError as error:
        gates, twin, trusted = _refused(error, model, inputs, references, options)
    # the gate's ONNX Runtime sessions and interpreters, before the twin's
    release_memory(model.ByteSize())
    if options.twin and twin is None:
        options.step("exact-grid twin: convert and compare")
        twin = check_twin(model, inputs, references, options.gate)
    if normalized.batch is not None and options.batch != 1:
        options.step(f"convert again at batch {options.batch}")
        original = load_onnx(onnx_path)
        flatbuffer, float_flatbuffer, gate = _rebatch(original, options, flatbuffer, inputs)
        float_bytes = len(float_flatbuffer)
        gates.append(gate)
        normalized.batch = options.batch
    written = _write_all(output_path, flatbuffer, write_float_tflite, float_flatbuffer)
    return ConversionResult(
        output=written,
        target=target,
        binary_layers=len(binary),
        lce_bconv2d=histogram.get("LceBconv2d", 0),
        float_conv2d=histogram.get("CONV_2D", 0) + histogram.get("DEPTHWISE_CONV_2D", 0),
        fully_connected=histogram.get("FULLY_CONNECTED", 0),
        op_histogram=histogram,
        samples=len(inputs),
        random_inputs=is_random,
        onnx_bytes=onnx_path.stat().st_size,
        lce_bytes=len(flatbuffer),
        tflite_float_bytes=float_bytes,
        float_output=Path(write_float_tflite) if write_float_tflite is not None else None,
        seconds=time.perf_counter() - start,
        gates=gates,
        twin=twin or [],
        float_fallbacks=allowed,
        normalized=normalized,
        trusted_twin=trusted,
    )


def _twin_verdict(
    model: onnx.ModelProto,
    inputs: np.ndarray,
    references: Sequence[Reference],
    options: ConvertOptions,
) -> tuple[list[GateReport] | None, str]:
    """(the twin's reports, or None when it failed or did not run; what it said, in words)."""
    if not options.twin:
        return None, "not run (twin check disabled)"
    options.step("exact-grid twin: convert and compare")
    try:
        reports = check_twin(model, inputs, references, options.gate)
    except ConversionMismatchError as error:
        return None, f"failed: {error}"
    worst = max(r.max_abs_diff for r in reports)
    return reports, f"passed ({len(reports)} comparisons, no tie, max |diff| {worst:.3g})"


def _refused(
    error: ConversionMismatchError,
    model: onnx.ModelProto,
    inputs: np.ndarray,
    references: Sequence[Reference],
    options: ConvertOptions,
) -> tuple[list[GateReport], list[GateReport] | None, dict]:
    """After the real-weight gate refused: run the twin and raise `error`, with the twin's
    verdict in its diagnostics, or the InconclusiveCheckError that explains it (a degenerate
    model, `converters.gate.inconclusive`). With `options.trust_twin`, an inconclusive model
    whose twin passes is accepted: returns (no gate reports, the twin's, the record)."""
    twin, said = _twin_verdict(model, inputs, references, options)
    rows = error.diagnostics.get("failing_samples") or list(range(len(inputs)))
    found = inconclusive(error, OnnxProbe(model), inputs, rows, options.gate, said)
    if found is None:
        raise error
    if not (options.trust_twin and twin is not None):
        raise found from None
    options.step("real-weight check inconclusive: accepted on the exact-grid twin (--trust-twin)")
    return [], twin, {**found.diagnostics, "inconclusive": str(found)}


def _rebatch(
    original: onnx.ModelProto, options: ConvertOptions, gated: bytes, inputs: np.ndarray
) -> tuple[bytes, bytes, GateReport]:
    """The model translated at batch `options.batch` (flatbuffer, float flatbuffer), and its
    comparison with the gated batch-1 flatbuffer: the same kernels per sample, so any
    difference beyond the tolerance is a translation error."""
    model, _ = normalize(original, options.batch, options.disabled_rewrites)
    rebatched = _translate(model, float_model=True)
    flatbuffer, float_flatbuffer = rebatched.flatbuffer, rebatched.float_flatbuffer or b""
    strict = GateOptions(rtol=options.gate.rtol)  # no probe: every sample must agree plainly
    names = ("LCE batch 1", f"LCE batch {options.batch}")
    report = validate(run_lce(gated, inputs), run_lce(flatbuffer, inputs), inputs, strict, names)
    return flatbuffer, float_flatbuffer, report


def _gates(
    onnx_path: Path | bytes,
    model: onnx.ModelProto,
    translated: Translated,
    inputs: np.ndarray,
    references: Sequence[Reference],
    options: ConvertOptions,
    check_float: bool,
) -> list[GateReport]:
    """LCE against ONNX Runtime and each reference; the float TFLite model against ONNX
    Runtime when it is written. One ONNX Runtime probe and one witness conversion, on demand.
    Recurring splits are judged where the translator decides signs exactly
    (`TranslationInfo.exact_sources`), each reference arbitrating the others'."""
    witnesses = WitnessModels(model)
    probes: dict[str, SignProbe] = {}

    def onnx_probe() -> SignProbe:
        if "onnx" not in probes:
            probes["onnx"] = OnnxProbe(model)
        return probes["onnx"]

    judged = frozenset(translated.info.exact_sources)
    onnx_outputs = run_onnx(onnx_path, inputs)
    lce_outputs = run_lce(translated.flatbuffer, inputs)
    lce_witness = witnesses.witness("LCE")
    # each reference's probe arbitrates the values the others split on (converters.gate)
    arbiters = [onnx_probe, *(ref.probe for ref in references if ref.probe is not None)]
    replay = Replay(onnx_probe, lce_witness, arbiters[1:], judged)
    gates = [
        validate(onnx_outputs, lce_outputs, inputs, options.gate, ("ONNX Runtime", "LCE"), replay)
    ]
    for ref in references:
        others = [a for a in arbiters if a is not ref.probe]
        replay = None if ref.probe is None else Replay(ref.probe, lce_witness, others, judged)
        found = ref.outputs(inputs)
        gates.append(validate(found, lce_outputs, inputs, options.gate, (ref.name, "LCE"), replay))
    if check_float:
        few = slice(0, FLOAT_CHECK_SAMPLES)
        gates.append(
            validate(
                onnx_outputs[few],
                run_tflite(translated.float_flatbuffer, inputs[few]),
                inputs[few],
                options.gate,
                ("ONNX Runtime", "float TFLite"),
                Replay(onnx_probe, witnesses.witness("float TFLite"), arbiters[1:], judged),
            )
        )
    return gates


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
