"""The gate of an int8 flatbuffer: the same quantized model as its QDQ reference in ONNX
Runtime, to within one quantization step per int8 tensor, and the sign-tie rules of
`converters.gate.predicate` for its binarizations.

Two correct int8 runtimes differ by rounding: TFLite requantizes with a fixed-point multiplier
and rounds half away from zero, ONNX Runtime rounds half to even, and a conv's float sum lands
on either side of a half step. One step in one tensor then moves everything after it, and a
binarization of an int8 tensor turns one step at the zero point into a sign. So the outputs are
compared as `validate` compares them, and a sample that differs is replayed layer by layer: the
candidate's own int8 tensors (read from a *witness*, the flatbuffer also outputting every int8
activation and binarization input) are imposed all at once in the reference (`QuantProbe`),
which then computes each int8 tensor from the candidate's tensors before it. The sample passes
only if

1. every int8 tensor of the candidate lies on the reference's grid (its scale and zero point:
   a value (v / scale + zero point) within `GRID_TOL` of an integer in [-128, 127]);
2. each is within one step of what the reference computes from the candidate's inputs to it
   (a translator that quantized with another range, another kernel or another layout is
   several steps off);
3. and, with those tensors and the candidate's signs imposed, `validate`'s replay rules hold
   (ties at float binarizations, the logits).

How many positions were one step apart is reported (`QuantizedCheck`).

One step per tensor would also pass a kernel whose integers are a step off at a few taps, yet
such a tap moves a conv's answer to a flat region and flips the binarization after it over
a whole background (docs/LCE_NOTES.md "int8 around binary layers"). So, before any sample,
every int8 kernel of the reference must be one of the flatbuffer's int8 constants exactly, in
TFLite's layout (`check_int8_kernels`).

Example:
    >>> checked = check_quantized(qdq_model=qdq, float_model=flt, translated=translated,
    ...     inputs=x, options=options)                                 # doctest: +SKIP
    >>> checked.gates[0].candidate                                     # doctest: +SKIP
    'LCE int8'
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from bnnexport.converters.errors import (
    AccuracyDropError,
    ConversionMismatchError,
    ConverterError,
    FloatFallbackError,
)
from bnnexport.converters.flatbuffer import constant_tensors, flatbuffer_ops
from bnnexport.converters.gate.checks import Checked, Checking, WitnessModels, check_twin
from bnnexport.converters.gate.predicate import GateOptions, Replay, Witness, validate
from bnnexport.converters.gate.probe import imposable, imposing_feed
from bnnexport.converters.graph import OnnxGraph
from bnnexport.converters.patterns import binarizations_in
from bnnexport.converters.runtimes import open_model, ort_session, run_lce, run_onnx
from bnnexport.converters.translate import Translated

GRID_TOL = 1e-3  # of a step: float32 rounding of (q - z) * scale is ~1e-5 of one
STEP_TOL = 1.0 + GRID_TOL  # one step, and the rounding of the two values compared


@dataclass
class QuantizedCheck:
    """What the int8 replay saw: the samples it replayed, the int8 tensors it checked, and how
    many positions were one step apart (summed over samples), in which tensor most."""

    replayed_samples: int = 0
    int8_tensors: int = 0
    one_step_positions: int = 0
    positions: int = 0
    most_steps_in: str | None = None
    by_tensor: dict[str, int] = field(default_factory=dict)
    # the candidate's outputs on the check samples (for the float agreement; not reported)
    outputs: Any = None

    def count(self, tensor: str, one_step: int, positions: int) -> None:
        """Add one replayed tensor's one-step positions out of `positions`."""
        self.one_step_positions += one_step
        self.positions += positions
        self.by_tensor[tensor] = self.by_tensor.get(tensor, 0) + one_step
        if any(self.by_tensor.values()):
            self.most_steps_in = max(self.by_tensor, key=self.by_tensor.__getitem__)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("by_tensor", "outputs")}


def activation_points(model: onnx.ModelProto) -> dict[str, tuple[float, int, int, int]]:
    """Each int8 activation of a QDQ model (the output of a DequantizeLinear that reads a
    QuantizeLinear) -> (scale, zero point, lowest, highest integer)."""
    graph = OnnxGraph.folded(model)
    points = {}
    for node in graph.nodes:
        source = graph.producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if source is None or source.op_type != "QuantizeLinear":
            continue
        zero = np.asarray(graph.const(node.input[2]) if len(node.input) > 2 else np.uint8(0))
        info = np.iinfo(zero.dtype)
        scale = float(np.asarray(graph.const(node.input[1])).reshape(-1)[0])
        points[node.output[0]] = (scale, int(zero.reshape(-1)[0]), info.min, info.max)
    return points


LAYER_OPS = ("Conv", "Gemm", "MatMul")


def quantized_from_float(model: onnx.ModelProto, points: dict[str, Any]) -> set[str]:
    """The points whose QuantizeLinear reads a float tensor no int8 layer writes (a graph
    input, a residual sum): in the flatbuffer a QUANTIZE op, not an int8 op, makes them."""
    graph = OnnxGraph.folded(model)
    found = set()
    for point in points:
        q = graph.producer[graph.producer[point].input[0]]
        source = graph.producer.get(q.input[0])
        if source is not None and source.op_type == "Relu":
            source = graph.producer.get(source.input[0])
        if source is None or source.op_type not in LAYER_OPS:
            found.add(point)
    return found


class CachedWitness:
    """A witness whose run on one sample is kept, so the probe (which imposes its int8
    tensors) and the replay (which imposes its signs) read the same run."""

    def __init__(self, witness: Witness) -> None:
        self.inner = witness
        self._last: tuple[str, tuple[np.ndarray, dict[str, np.ndarray]]] | None = None

    def run(self, x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        key = hashlib.sha1(np.ascontiguousarray(x, np.float32).tobytes()).hexdigest()
        if self._last is None or self._last[0] != key:
            self._last = (key, self.inner.run(x))
        return self._last[1]

    def as_witness(self) -> Witness:
        return Witness(run=self.run, negative=self.inner.negative)


class QuantProbe:
    """The QDQ model in ONNX Runtime with every int8 activation and every binarization
    imposable: a `SignProbe` (`sources`, `run`) that imposes the witness's int8 tensors on each
    run and checks them (module doc, rules 1 and 2)."""

    def __init__(self, model: onnx.ModelProto, witness: CachedWitness, stats: QuantizedCheck):
        self.witness, self.stats = witness, stats
        model = onnx.ModelProto.FromString(model.SerializeToString())
        for k, node in enumerate(model.graph.node):
            node.name = node.name or f"__node_{k}"
        self.points = activation_points(model)
        # a point that is the model's output: the witness gives it as its logits
        self.model_outputs = {o.name for o in model.graph.output}
        self.from_float = quantized_from_float(model, self.points)
        stats.int8_tensors = len(self.points)
        renamed = _outputs_read(model, self.points)
        self.own = [renamed.get(p, p) for p in self.points]  # the tensor of its own value
        readers = {t: [n.name for n in model.graph.node if t in n.input] for t in self.own}
        model = imposable(model, readers, "quant")
        graph = OnnxGraph.folded(model)
        consumers: dict[str, list[str]] = {}
        for found in binarizations_in(graph):
            consumers.setdefault(found.source, []).append(found.nodes[0])
        model = imposable(model, consumers, "tie")
        suffix = "__quant_chosen"  # a binarization of an int8 tensor reads the imposed one
        self.sources = [s[: -len(suffix)] if s.endswith(suffix) else s for s in consumers]
        self.session = ort_session(model.SerializeToString())
        self.input = self.session.get_inputs()[0]
        names = [o.name for o in self.session.get_outputs()]
        self.own_index = [names.index(o) for o in self.own]
        self.source_index = [names.index(s) for s in consumers]

    def run(
        self, x: np.ndarray, imposed: list[np.ndarray] | None = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        feed = imposing_feed(self.input, x, len(self.sources), imposed)
        logits, theirs = self.witness.run(x)
        theirs = {**theirs, **dict.fromkeys(self.model_outputs & set(self.points), logits)}
        theirs.update({p: self._quantized(p, theirs[p]) for p in self.from_float if p in theirs})
        for k, point in enumerate(self.points):
            if point not in theirs:
                raise ConversionMismatchError(f"the int8 witness lacks int8 tensor {point!r}")
            feed[f"quant_mask_{k}"] = np.ones(1, bool)
            feed[f"quant_value_{k}"] = np.asarray(theirs[point], np.float32)[None]
        outputs = self.session.run(None, feed)
        for k, point in enumerate(self.points):
            self._check(point, np.asarray(theirs[point]), outputs[self.own_index[k]][0])
        return outputs[0][0], [outputs[i][0] for i in self.source_index]

    def _quantized(self, point: str, value: np.ndarray) -> np.ndarray:
        """The candidate's int8 value of a point it quantizes from a float tensor (a QUANTIZE
        op): its witness outputs the float tensor itself (TFLite drops a fake quantization
        whose int8 tensor is read only by an output), so the op's rule is applied here:
        value x (1 / scale) in float32, rounded half to even, plus the zero point. That is what
        TFLite's vectorised QUANTIZE computes (on x86 and ARM alike); its scalar loop for the
        last few elements of a tensor rounds half away from zero, which matters only for values
        exactly half a step between two integers (docs/LCE_NOTES.md "int8 around binary
        layers": every MNIST pixel is one at a range of [-1, 1])."""
        scale, zero, lowest, highest = self.points[point]
        q = tflite_quantize(value, scale, zero, lowest, highest)
        return ((q - zero) * np.float32(scale)).astype(np.float32)

    def _check(self, point: str, theirs: np.ndarray, mine: np.ndarray) -> None:
        """ConversionMismatchError unless the candidate's tensor `point` is on the reference's
        grid and within one step of the reference's own (module doc)."""
        scale, zero, lowest, highest = self.points[point]
        steps = np.asarray(theirs, np.float64).reshape(mine.shape) / scale + zero
        nearest = np.rint(steps)
        off = np.abs(steps - nearest)
        outside = (nearest < lowest) | (nearest > highest)
        if off.max(initial=0.0) > GRID_TOL or outside.any():
            at = int(np.argmax(off + outside))
            raise ConversionMismatchError(
                f"int8 tensor {point!r} of the candidate is not on the reference's grid (scale "
                f"{scale:.6g}, zero point {zero}): {theirs.reshape(-1)[at]:.6g} at position {at} "
                "is no int8 value of it (a tensor quantized with another range)",
                {"int8_tensor": point, "position": at, "scale": scale, "zero_point": zero},
            )
        apart = np.abs(steps - (np.asarray(mine, np.float64) / scale + zero))
        refuse_beyond_one_step(
            point, apart, ("the candidate", "the reference's"),
            "given the same int8 inputs (at most one step is rounding): the layer is computed "
            "otherwise",
        )  # fmt: skip
        self.stats.count(point, int((apart > GRID_TOL).sum()), int(apart.size))


def refuse_beyond_one_step(
    point: str, apart: np.ndarray, between: tuple[str, str], context: str
) -> None:
    """ConversionMismatchError when the int8 tensor `point` is more than one step (`STEP_TOL`)
    from its reference anywhere: one step is rounding (module doc), more is another computation.
    `apart` is the distance in steps, position by position; `between` names the two sides (the
    one checked, the reference's), `context` ends the message. The one rule for int8 tensors,
    here and in bnnexport's PyTorch probe.

    Example:
        >>> refuse_beyond_one_step("t", np.array([0.0, 1.0]), ("a", "b's"), "")
        >>> try:
        ...     refuse_beyond_one_step("t", np.array([0.0, 2.0]), ("a", "b's"), "(end)")
        ... except ConversionMismatchError as refused:
        ...     print(refused)
        int8 tensor 't' of a is 2 steps from b's at position 1 (end)
    """
    if apart.max(initial=0.0) <= STEP_TOL:
        return
    at = int(np.argmax(apart))
    steps = float(apart.reshape(-1)[at])
    raise ConversionMismatchError(
        f"int8 tensor {point!r} of {between[0]} is {steps:.3g} steps from {between[1]} at "
        f"position {at} {context}",
        {"int8_tensor": point, "position": at, "steps": steps},
    )


def tflite_quantize(
    value: np.ndarray, scale: float, zero: int, lowest: int = -128, highest: int = 127
) -> np.ndarray:
    """The integers TFLite's vectorised QUANTIZE gives a float tensor: value x (1 / scale) in
    float32, rounded half to even, plus the zero point, clipped (`QuantProbe._quantized`)."""
    ratio = np.asarray(value, np.float32) * (np.float32(1.0) / np.float32(scale))
    return np.clip(np.rint(ratio) + zero, lowest, highest)


def _outputs_read(model: onnx.ModelProto, points: dict[str, Any]) -> dict[str, str]:
    """Rename each graph output that is an int8 activation to `NAME__computed`, read by an
    Identity that gives the output's name, so that imposing it imposes the output (changes
    `model`); the renamed tensors by point."""
    outputs = {o.name for o in model.graph.output}
    renamed = {}
    for node in list(model.graph.node):
        for k, name in enumerate(node.output):
            if name in outputs and name in points:
                renamed[name] = node.output[k] = f"{name}__computed"
                identity = onnx.helper.make_node(
                    "Identity", [renamed[name]], [name], name=f"{name}__identity"
                )
                model.graph.node.append(identity)
    return renamed


def check_quantized(
    *,
    qdq_model: onnx.ModelProto,
    float_model: onnx.ModelProto,
    translated: Translated,
    inputs: np.ndarray,
    options: Checking,
    stats: QuantizedCheck | None = None,
) -> Checked:
    """LCE's int8 flatbuffer against the QDQ model in ONNX Runtime (module doc), then the
    exact-grid twin of the float graph (the translation of every layer, without rounding).
    Raises ConversionMismatchError on a refusal."""
    stats = stats if stats is not None else QuantizedCheck()
    options.step(f"gate: LCE int8 against the int8 model in ONNX Runtime on {len(inputs)} samples")
    reference = run_onnx(qdq_model.SerializeToString(), inputs)
    candidate = stats.outputs = run_lce(translated.flatbuffer, inputs)
    layout = translated.input_layout  # the witness and the twin take the flatbuffer's input
    witness = CachedWitness(WitnessModels(qdq_model, False, layout).witness("LCE"))
    probe: list[QuantProbe] = []

    def build() -> QuantProbe:
        if not probe:
            probe.append(QuantProbe(qdq_model, witness, stats))
        return probe[0]

    replay = Replay(build, witness.as_witness(), judged=frozenset(translated.info.exact_sources))
    names = ("ONNX Runtime int8", "LCE int8")
    gate = validate(reference, candidate, inputs, options.gate, names, _counting(replay, stats))
    twin = []
    if options.twin:
        options.step("exact-grid twin of the float graph: convert and compare")
        twin = check_twin(float_model, inputs, (), options.gate, layout or "nchw")
    return Checked([gate], twin)


def _counting(replay: Replay, stats: QuantizedCheck) -> Replay:
    """`replay` with each replayed sample counted in `stats`."""
    inner: Callable = replay.witness.run

    def run(x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        stats.replayed_samples += 1
        return inner(x)

    return Replay(replay.probe, Witness(run, replay.witness.negative), (), replay.judged)


INT8_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def int8_census(flatbuffer: bytes, int8_layers: list[str]) -> dict[str, int]:
    """How many conv and dense ops of the flatbuffer read int8 and how many float;
    FloatFallbackError (exit 1) when fewer read int8 than `int8_layers` were meant to."""
    ops = [op for op in flatbuffer_ops(flatbuffer) if op.op_type in INT8_OPS]
    int8 = sum(1 for op in ops if op.input_types[:1] == ["INT8"])
    if int8 < len(int8_layers):
        raise FloatFallbackError(
            f"{len(int8_layers) - int8} of the {len(int8_layers)} float layers meant to run in "
            f"int8 ({', '.join(int8_layers)}) stayed float ops in the flatbuffer"
        )
    return {"int8_ops": int8, "float_ops": len(ops) - int8}


def int8_kernels(qdq_model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The int8 kernel of each conv and dense node of a QDQ model, by node name: the int8
    constant its weight's DequantizeLinear reads."""
    graph = OnnxGraph(qdq_model)
    kernels = {}
    for node in graph.nodes:
        maker = graph.producer.get(node.input[1]) if node.op_type in KERNEL_OPS else None
        kernel = (
            graph.const(maker.input[0]) if maker and maker.op_type == "DequantizeLinear" else None
        )
        if kernel is not None and kernel.dtype == np.int8:
            kernels[node.name] = kernel
    return kernels


KERNEL_OPS = ("Conv", "Gemm", "MatMul")


def _rows(kernel: np.ndarray) -> list[np.ndarray]:
    """A kernel as its output channels' sorted integers, for each axis its output channels may
    lie on (the first: ONNX's conv and Gemm, TFLite's conv and dense; the last: TFLite's
    depthwise conv, a Gemm with transB=0). Sorted because the translator may order a
    channel's taps otherwise (a dense layer after a flatten reads NHWC, not NCHW); a tap
    another integer changes its channel's sorted integers."""
    return [np.sort(np.moveaxis(kernel, axis, 0).reshape(kernel.shape[axis], -1), axis=1)
            for axis in (0, kernel.ndim - 1)]  # fmt: skip


def check_int8_kernels(qdq_model: onnx.ModelProto, flatbuffer: bytes) -> int:
    """How many int8 kernels the flatbuffer holds as the reference holds them (module doc):
    the same output channels, each with the same integers; ConversionMismatchError naming
    the first layer whose kernel it does not hold, with how many integers of the nearest
    kernel of its size differ."""
    stored = [rows for k in constant_tensors(flatbuffer, "INT8") for rows in _rows(k)]
    kernels = int8_kernels(qdq_model)
    for layer, kernel in kernels.items():
        mine = _rows(kernel)
        if any(a.shape == b.shape and np.array_equal(a, b) for a in mine for b in stored):
            continue
        apart = [int((a != b).sum()) for a in mine for b in stored if a.shape == b.shape]
        nearest = (f"the nearest of its size differs at {min(apart)} of {kernel.size} integers"
                   if apart else "none has its size")  # fmt: skip
        raise ConversionMismatchError(
            f"the int8 kernel of {layer!r} is not in the flatbuffer as the reference quantized "
            f"it: {nearest} (a kernel's integers must be the reference's exactly)",
            {"why": "int8 kernel", "layer": layer, "integers_apart": min(apart, default=None)},
        )
    return len(kernels)


def float_agreement(
    float_model: onnx.ModelProto, outputs: np.ndarray, inputs: np.ndarray, labels: Any
) -> dict[str, Any]:
    """The int8 model's `outputs` against the float model's (ONNX Runtime) on `inputs`: argmax
    agreement and, for the samples with a label (>= 0), both top-1 accuracies and the drop
    in points."""
    reference = run_onnx(float_model.SerializeToString(), inputs)
    mine, theirs = outputs.reshape(len(outputs), -1), reference.reshape(len(reference), -1)
    found: dict[str, Any] = {
        "samples": len(inputs),
        "float_argmax_agreement": float(np.mean(mine.argmax(1) == theirs.argmax(1))),
        "labelled": 0, "float_top1": None, "int8_top1": None, "top1_drop_points": None,
    }  # fmt: skip
    labels = None if labels is None else np.asarray(labels).reshape(-1)
    if labels is not None and len(labels) == len(inputs) and (labels >= 0).any():
        known = labels >= 0
        float_top1 = float(np.mean(theirs[known].argmax(1) == labels[known]))
        int8_top1 = float(np.mean(mine[known].argmax(1) == labels[known]))
        found.update(labelled=int(known.sum()), float_top1=float_top1, int8_top1=int8_top1,
                     top1_drop_points=100.0 * (float_top1 - int8_top1))  # fmt: skip
    return found


def refuse_accuracy_drop(accuracy: dict[str, Any], limit: float | None) -> None:
    """AccuracyDropError (exit 1) when the int8 model's top-1 is more than `limit` points below
    the float model's (None: no limit; no labelled sample: nothing to judge)."""
    drop = accuracy.get("top1_drop_points")
    if limit is None or drop is None or drop <= limit:
        return
    raise AccuracyDropError(
        f"int8 loses {drop:.2f} points of top-1 on {accuracy['labelled']} labelled samples "
        f"({accuracy.get('against', 'float model')} {100 * accuracy['float_top1']:.2f} %, "
        f"int8 {100 * accuracy['int8_top1']:.2f} "
        f"%), more than the {limit:g} allowed (--max-accuracy-drop): calibrate on more samples, "
        "train with --float-layers int8, or allow more",
        {"why": "accuracy drop", **accuracy, "max_accuracy_drop": limit},
    )


def check_int8_io(translated: Translated, inputs: np.ndarray) -> None:
    """ConversionMismatchError unless the int8-io flatbuffer gives, on `inputs` quantized with
    its input scale, the int8 outputs of the checked float-io one on the same int8 inputs:
    they are one int8 graph with and without QUANTIZE/DEQUANTIZE at its ends (compared
    dequantized, to within float rounding of a step)."""
    model = open_model("lce", translated.int8_io_flatbuffer)
    if None in (model.interpreter.input_scales[0], model.interpreter.output_scales[0]):
        # `converters.quantize.quantize(int8_outputs=True)` gives every output a point
        raise ConverterError(
            "--io int8: LCE's converter left the flatbuffer's input or output float (no int8 "
            "scale): convert with --io float32"
        )
    scale = model.interpreter.input_scales[0]
    zero = model.interpreter.input_zero_points[0]
    on_grid = (np.clip(np.rint(inputs / scale) + zero, -128, 127) - zero) * scale
    on_grid = on_grid.astype(np.float32)
    theirs, mine = model.run(on_grid), run_lce(translated.flatbuffer, on_grid)
    worst = float(np.abs(theirs - mine).max())
    if worst > GRID_TOL * model.interpreter.output_scales[0]:  # the same int8 outputs
        raise ConversionMismatchError(
            f"the int8-io flatbuffer differs from the checked float-io one by {worst:.3g} on "
            "the same int8 inputs",
            {"why": "int8 io", "max_abs_diff": worst},
        )


def check_int8(
    quantized: Any, translated: Translated, inputs: np.ndarray, labels: Any, options: Any
) -> tuple[Checked, dict[str, Any]]:
    """Every check of an int8 conversion, in order: its float layers int8 ops
    (`int8_census`), their kernels the reference's integers (`check_int8_kernels`), the gate
    against the quantized reference (`check_quantized`), the int8-io copy (`check_int8_io`),
    and the accuracy against the float model (a model that carried trained ranges: against
    itself as trained, `Quantized.accuracy_reference`) (`refuse_accuracy_drop`). Returns the
    checks and the report's `int8` part: `quantized.report` (a `converters.quantize.Quantized`'s)
    with the op census, the replay's numbers and the accuracy."""
    census = int8_census(translated.flatbuffer, quantized.report.int8_layers)
    census["int8_kernels_checked"] = check_int8_kernels(quantized.model, translated.flatbuffer)
    census["binarizations_rewired_to_int8"] = translated.int8_binarizations_rewired
    stats = QuantizedCheck()
    checked = check_quantized(
        qdq_model=quantized.model, float_model=quantized.float_model, translated=translated,
        inputs=inputs, options=options, stats=stats,
    )  # fmt: skip
    if translated.int8_io_flatbuffer is not None:
        check_int8_io(translated, inputs)
    reference = quantized.accuracy_reference or quantized.float_model
    accuracy = float_agreement(reference, stats.outputs, inputs, labels)
    accuracy["against"] = quantized.reference_name
    refuse_accuracy_drop(accuracy, options.max_accuracy_drop)
    io = "int8" if translated.int8_io_flatbuffer is not None else "float32"
    return checked, {
        **quantized.report.to_json(), **census, "io": io, "check": stats.to_json(),
        "accuracy": accuracy,
    }  # fmt: skip


__all__ = [
    "GateOptions",
    "QuantProbe",
    "QuantizedCheck",
    "activation_points",
    "check_int8",
    "check_int8_kernels",
    "tflite_quantize",
    "check_quantized",
]
