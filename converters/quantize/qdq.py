"""The quantized model in QDQ form: what ONNX Runtime runs as the int8 reference and what the
translator turns into int8 ops.

`write_qdq` rewrites each unit (`converters.quantize.units`) of a float graph the way ONNX
Runtime's static quantization writes a model:

- the kernel, BatchNorm folded in, becomes `DequantizeLinear(int8, scale per output channel,
  zero point 0)` with scale = max |kernel row| / 127 and the integers round(kernel / scale) in
  [-127, 127], a few of a conv's taps rounded the other way so each spatial window keeps its
  sum (`kernel_integers`; not for a model trained with its ranges, whose kernels trained
  plainly rounded). TFLite's converter derives the same scale and integers itself from the
  float kernel they make (a tap at +-127 never moves), between quantized activations
  (docs/LCE_NOTES.md "int8 around binary layers"), so the flatbuffer and the reference hold the
  same integers;
- the bias becomes `DequantizeLinear(int32, input scale x kernel scale)`, lowered by half an
  output step when the output is read only by binarizations (`Unit.sign_only`);
- a MatMul becomes a Gemm (so it has a bias input), alpha and beta folded into the constants;
- every quantization point (a unit's input and output) gets `QuantizeLinear -> DequantizeLinear`
  per tensor with its `QuantPoint` (int8, asymmetric). A unit's output keeps its name, so all
  its readers and a graph output read the dequantized tensor; a unit's input that no unit
  writes is read quantized by the units only, under a new name.

`read_qdq` does the opposite for a graph that carries its own ranges (quantization-aware
training, exported as QuantizeLinear/DequantizeLinear): it drops every activation pair and
returns the float graph with the ranges it held.

Example:
    >>> point = QuantPoint.of_range(-1.0, 3.0)
    >>> round(point.scale * 255, 6), point.zero_point
    (4.0, -64)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from bnnexport.converters.errors import ConverterError
from bnnexport.converters.graph import OnnxGraph, attributes
from bnnexport.converters.quantize.units import Unit, UnitPlan
from onnx import helper

QMIN, QMAX = -128, 127  # int8 activations
KERNEL_LIMIT = 127  # int8 kernels are symmetric: [-127, 127], zero point 0
# QuantizeLinear with a per-axis scale (int8 kernels) needs opset 13
MIN_OPSET = 13


@dataclass(frozen=True)
class QuantPoint:
    """An activation quantized per tensor: real value = (q - zero_point) * scale, q int8."""

    scale: float
    zero_point: int

    @classmethod
    def of_range(cls, lo: float, hi: float) -> QuantPoint:
        """The point whose 256 steps cover [lo, hi] widened to hold 0, with 0 exactly
        representable (the zero point an integer), as TensorFlow's fake quantization nudges
        its range (docs/LCE_NOTES.md "int8 around binary layers")."""
        lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ConverterError(f"cannot quantize a tensor whose range is [{lo}, {hi}]")
        scale = float(np.float32((hi - lo) / (QMAX - QMIN))) if hi > lo else 1.0
        zero_point = int(np.clip(round(QMIN - lo / scale), QMIN, QMAX))
        return cls(scale, zero_point)

    @property
    def range(self) -> tuple[float, float]:
        """The lowest and highest value the point holds."""
        return (QMIN - self.zero_point) * self.scale, (QMAX - self.zero_point) * self.scale

    def to_json(self) -> dict[str, float | int]:
        return {"scale": self.scale, "zero_point": self.zero_point}


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _fresh(graph: OnnxGraph, base: str) -> str:
    """A name no tensor of `graph` has (a model quantized before holds `fresh` names too)."""
    taken = {i.name for i in graph.inputs}
    while True:
        name = graph.fresh(base)
        if name not in graph.constants and name not in graph.producer and name not in taken:
            return name


def _constant(graph: OnnxGraph, value: np.ndarray, base: str) -> str:
    name = _fresh(graph, base)
    graph.constants[name] = np.asarray(value)
    return name


def _check_opset(graph: OnnxGraph) -> None:
    versions = [o.version for o in graph.model.opset_import if o.domain in ("", "ai.onnx")]
    if versions and max(versions) < MIN_OPSET:
        raise ConverterError(
            f"int8 needs ONNX opset {MIN_OPSET} or later (per-channel QuantizeLinear); the model "
            f"has opset {max(versions)}: export it again with opset_version={MIN_OPSET} or more"
        )


def _node(graph: OnnxGraph, name: str) -> onnx.NodeProto:
    return next(n for n in graph.nodes if (n.name or n.output[0]) == name)


def _kernel_and_bias(graph: OnnxGraph, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray, int]:
    """(kernel as float64, bias as float64, output-channel axis) with Gemm's alpha and beta
    applied; a MatMul's kernel is [in, out]."""
    kernel = graph.const(node.input[1]).astype(np.float64)
    attrs = attributes(node)
    axis = 0
    if node.op_type == "MatMul" or (node.op_type == "Gemm" and not attrs.get("transB", 0)):
        axis = 1
    if node.op_type == "Gemm":
        kernel = kernel * attrs.get("alpha", 1.0)
    channels = kernel.shape[axis]
    bias = graph.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    bias = np.zeros(channels) if bias is None else np.asarray(bias, np.float64).reshape(-1)
    if node.op_type == "Gemm":
        bias = bias * attrs.get("beta", 1.0)
    return kernel, np.broadcast_to(bias, (channels,)).copy(), axis


def _fold_batch_norm(graph: OnnxGraph, unit: Unit, kernel, bias, axis):
    """Kernel and bias with the unit's BatchNormalization folded in (float64)."""
    if unit.batch_norm is None:
        return kernel, bias
    bn = _node(graph, unit.batch_norm)
    gamma, beta, mean, var = (graph.const(n).astype(np.float64) for n in bn.input[1:5])
    m = gamma / np.sqrt(var + attributes(bn).get("epsilon", 1e-5))
    shape = [1] * kernel.ndim
    shape[axis] = -1
    return kernel * m.reshape(shape), (bias - mean) * m + beta


def kernel_scales(kernel: np.ndarray, axis: int) -> np.ndarray:
    """Per output channel, max |kernel| / 127 in float32 (1 for an all-zero channel)."""
    moved = np.moveaxis(np.asarray(kernel, np.float32), axis, 0).reshape(kernel.shape[axis], -1)
    top = np.abs(moved).max(axis=1)
    return np.where(top > 0, top / np.float32(KERNEL_LIMIT), np.float32(1.0)).astype(np.float32)


def kernel_integers(steps: np.ndarray, keep_window_sums: bool = True) -> np.ndarray:
    """The int8 integers of a kernel given in steps of its scale (`steps`, max |row| 127): each
    rounded to the nearest, then, with `keep_window_sums`, in every spatial window of a conv
    kernel (one output channel, one input channel: its kh x kw taps) the fewest moved by one
    step the other way so the window's sum is its float sum rounded.

    Why: a conv's answer to a flat region (a background of one value, the most common input
    of an image model) is the value times the window's sum; rounding each tap alone lets that
    sum drift by up to half a step per tap, which moves a channel's flat-region output across 0
    and flips its binarization over the whole background (docs/LCE_NOTES.md "int8 around binary
    layers": 1.4 points of mnist-bnn's top-1). The taps moved are those rounded farthest (their
    error at most one step); a tap at +-127 (the one that sets the scale) never moves, and a
    dense or 1x1 kernel has one tap per window: nothing moves.

    >>> kernel_integers(np.array([[[[0.4, 0.4], [0.4, 127.0]]]])).tolist()
    [[[[1.0, 0.0], [0.0, 127.0]]]]
    >>> kernel_integers(np.array([[[[0.4, 0.4], [0.4, 127.0]]]]), False).tolist()
    [[[[0.0, 0.0], [0.0, 127.0]]]]
    """
    ints = np.clip(np.rint(steps), -KERNEL_LIMIT, KERNEL_LIMIT)
    if not keep_window_sums or steps.ndim != 4 or steps.shape[2] * steps.shape[3] == 1:
        return ints
    windows = steps.reshape(-1, steps.shape[2] * steps.shape[3]).astype(np.float64)
    rounded = ints.reshape(windows.shape)
    missing = np.rint(windows.sum(1)) - rounded.sum(1)  # whole steps the window's sum lacks
    direction = np.sign(missing)[:, None]
    # the taps that moving by `direction` brings nearest their float value come first; the
    # taps at the limit cannot move
    urgency = (windows - rounded) * direction
    urgency[np.abs(rounded) >= KERNEL_LIMIT] = -np.inf
    rank = np.argsort(np.argsort(-urgency, axis=1, kind="stable"), axis=1)
    moved = (rank < np.abs(missing)[:, None]) & np.isfinite(urgency)
    return (rounded + moved * direction).reshape(steps.shape)


def _dequantized(graph: OnnxGraph, base: str, values, scale, zero, axis: int) -> str:
    """A DequantizeLinear of constant `values`; the name of its output."""
    names = [
        _constant(graph, values, f"{base}_quantized"),
        _constant(graph, scale, f"{base}_scale"),
        _constant(graph, zero, f"{base}_zero_point"),
    ]
    out = _fresh(graph, f"{base}_dequantized")
    node = helper.make_node("DequantizeLinear", names, [out], name=out, axis=axis)
    graph.nodes = [*graph.nodes, node]
    return out


def _write_unit(
    graph: OnnxGraph,
    unit: Unit,
    points: dict[str, QuantPoint],
    exact_signs: set[str],
    window_sums: set[str],
) -> None:
    """Replace a unit's layer (and its BatchNorm) by the layer on int8 kernel (its windows' sums
    kept when it is in `window_sums`) and int32 bias, lowered by half an output step when its
    output is in `exact_signs`."""
    node = _node(graph, unit.layer)
    kernel, bias, axis = _kernel_and_bias(graph, node)
    kernel, bias = _fold_batch_norm(graph, unit, kernel, bias, axis)
    if unit.sign_only and unit.output in exact_signs:  # its int8 sign is the float sign
        bias = bias - points[unit.output].scale / 2
    scales = kernel_scales(kernel, axis)
    shape = [1] * kernel.ndim
    shape[axis] = -1
    steps = kernel.astype(np.float32) / scales.reshape(shape)
    ints = kernel_integers(steps, keep_window_sums=unit.layer in window_sums)
    bias_scale = (np.float32(points[unit.input].scale) * scales).astype(np.float32)
    limit = np.iinfo(np.int32)
    bias_ints = np.clip(np.rint(bias / bias_scale.astype(np.float64)), limit.min, limit.max)
    base = unit.layer.strip("/").replace("/", "_") or "layer"
    w = _dequantized(graph, f"{base}_kernel", ints.astype(np.int8), scales,
                     np.zeros_like(scales, np.int8), axis)  # fmt: skip
    b = _dequantized(graph, f"{base}_bias", bias_ints.astype(np.int32), bias_scale,
                     np.zeros_like(bias_scale, np.int32), 0)  # fmt: skip
    output = node.output[0]
    if unit.batch_norm is not None:
        bn = _node(graph, unit.batch_norm)
        output = bn.output[0]
        graph.remove(bn)
    attrs = {k: v for k, v in attributes(node).items() if k not in ("alpha", "beta")}
    op = "Gemm" if node.op_type == "MatMul" else node.op_type
    if op == "Gemm":
        attrs["transB"] = int(axis == 0)
    layer = helper.make_node(op, [node.input[0], w, b], [output], name=node.name, **attrs)
    graph.replace(node, [layer])


def _write_point(
    graph: OnnxGraph, tensor: str, point: QuantPoint, readers: list[str] | None
) -> str:
    """QuantizeLinear -> DequantizeLinear on `tensor`; the dequantized tensor's name. With
    `readers` None every reader reads it, under the tensor's own name (a graph output keeps
    its name); otherwise only the nodes named in `readers` read it, under a new name."""
    scale = _constant(graph, np.float32(point.scale), f"{tensor}_scale")
    zero = _constant(graph, np.int8(point.zero_point), f"{tensor}_zero_point")
    quantized = _fresh(graph, f"{tensor}_int8")
    producer = graph.producer.get(tensor)
    if readers is None:
        source, out = _fresh(graph, f"{tensor}_float"), tensor
        producer.output[:] = [source if o == tensor else o for o in producer.output]
    else:
        source, out = tensor, _fresh(graph, f"{tensor}_dequantized")
        for node in graph.consumers.get(tensor, ()):
            if (node.name or node.output[0]) in readers:
                graph.set_inputs(node, [out if v == tensor else v for v in node.input])
    nodes = [
        helper.make_node("QuantizeLinear", [source, scale, zero], [quantized], name=quantized),
        helper.make_node("DequantizeLinear", [quantized, scale, zero], [out], name=out),
    ]
    graph.nodes = [*graph.nodes, *nodes]  # `write_qdq` sorts the nodes at the end
    return out


def write_qdq(
    model: onnx.ModelProto,
    plan: UnitPlan,
    points: dict[str, QuantPoint],
    exact_signs: set[str] | None = None,
    window_sums: set[str] | None = None,
) -> tuple[onnx.ModelProto, dict[str, QuantPoint]]:
    """The QDQ model of `model` (module doc) with `points` (by float tensor name, one for each
    of `plan.points()`); and the points by the name of their dequantized tensor. The units
    whose output is read only as signs (`Unit.sign_only`) and in `exact_signs` (default: all)
    get half an output step off their bias; the layers in `window_sums` (default: all) keep
    each kernel window's sum (`kernel_integers`). A model trained with its ranges learnt the
    plain rounding, so `converters.quantize.quantize` does both for calibrated models only."""
    graph = OnnxGraph.folded(_copy(model))  # the rewrite edits nodes in place
    _check_opset(graph)
    points = {**points, **{t: points[s] for t, s in plan.shared().items() if s in points}}
    missing = [t for t in plan.points() if t not in points]
    if missing:
        raise ConverterError(f"no range for the int8 activation {missing[0]!r}")
    if exact_signs is None:
        exact_signs = {unit.output for unit in plan.units}
    if window_sums is None:
        window_sums = {unit.layer for unit in plan.units}
    for unit in plan.units:
        _write_unit(graph, unit, points, exact_signs, window_sums)
    outputs = plan.outputs()
    written = {}
    for tensor in plan.points():
        readers = None if tensor in outputs else plan.readers(tensor)
        written[_write_point(graph, tensor, points[tensor], readers)] = points[tensor]
    graph.nodes = _sorted(graph)
    return graph.build(), written


def _sorted(graph: OnnxGraph) -> list[onnx.NodeProto]:
    """The nodes in an order where every input is computed before it is read."""
    ready = {i.name for i in graph.inputs} | set(graph.constants)
    pending, ordered = list(graph.nodes), []
    while pending:
        progress = [n for n in pending if all(not i or i in ready for i in n.input)]
        if not progress:
            raise ConverterError("internal error: the int8 rewrite left a cycle in the graph")
        for node in progress:
            ordered.append(node)
            ready.update(node.output)
        pending = [n for n in pending if all(n is not p for p in progress)]
    return ordered


def _point_of_pair(graph: OnnxGraph, dq: onnx.NodeProto) -> tuple[str, QuantPoint] | None:
    """(float tensor, point) of an activation `QuantizeLinear -> DequantizeLinear` pair ending
    at `dq`, per tensor with constant scale and zero point; None for anything else."""
    q = graph.producer.get(dq.input[0])
    if q is None or q.op_type != "QuantizeLinear" or graph.const(q.input[0]) is not None:
        return None
    scale = graph.scalar(q.input[1])
    zero = graph.const(q.input[2]) if len(q.input) > 2 and q.input[2] else np.uint8(0)
    if scale is None or zero is None or np.asarray(zero).size != 1:
        return None
    if list(dq.input[1:]) != list(q.input[1:]):
        return None
    zero = np.asarray(zero)
    lowest = np.iinfo(zero.dtype).min if zero.dtype.kind in "iu" else QMIN
    # the same real range in int8: a uint8 point's zero point moves by -128
    return q.input[0], QuantPoint(scale, int(zero.reshape(-1)[0]) + QMIN - int(lowest))


def read_qdq(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, QuantPoint]]:
    """The float graph of a QDQ model and its activation points, by float tensor name
    (module doc). A model without such pairs comes back unchanged, with no points."""
    graph = OnnxGraph.folded(_copy(model))  # the rewrite edits nodes in place
    points: dict[str, QuantPoint] = {}
    outputs = {o.name for o in graph.outputs}
    for dq in [n for n in graph.nodes if n.op_type == "DequantizeLinear"]:
        found = _point_of_pair(graph, dq)
        if found is None:
            continue
        source, point = found
        q = graph.producer[dq.input[0]]
        producer = graph.producer.get(source)
        if dq.output[0] in outputs and producer is not None and source not in outputs:
            # the output keeps its name, given to the tensor it quantized: the float graph is
            # then the one a float export writes (an Identity there would stand between a
            # unit and the output, and the translator's witness lose the output's name)
            graph.rename_uses(source, dq.output[0])
            producer.output[list(producer.output).index(source)] = dq.output[0]
            graph.remove(dq)
            source = dq.output[0]
        elif dq.output[0] in outputs:  # a graph input or output: an Identity keeps the name
            graph.replace(dq, [helper.make_node("Identity", [source], [dq.output[0]])])
        else:
            graph.rename_uses(dq.output[0], source)
            graph.remove(dq)
        points[source] = point
        if not graph.consumers.get(q.output[0]):
            graph.remove(q)
    return (graph.build() if points else model), points
