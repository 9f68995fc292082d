"""Which float layers of a normalised ONNX BNN run in int8, and where their activations are
quantized.

A *unit* is what TFLite runs as one int8 op: a float `Conv` (groups 1, or depthwise) or a
`MatMul`/`Gemm` with a constant 2-D kernel, the `BatchNormalization` right after it (folded
into its kernel and bias), and a `Relu` after that (fused into the op). Its *input* and its
*output* (after the Relu, or the BatchNorm, or the layer itself) are the quantization points:
activations quantized per tensor. Binary layers are never units: they stay `LceBconv2d`, which
reads int8 where a unit's output feeds its binarization.

A layer that cannot be a unit stays float, with the reason in `UnitPlan.kept_float`: a grouped
(not depthwise) conv, a kernel that is not constant, a 3-D MatMul, Gemm with transA.

Example:
    >>> plan = find_units(OnnxGraph.folded(model))                      # doctest: +SKIP
    >>> [(u.layer, u.input, u.output) for u in plan.units]              # doctest: +SKIP
    [('/features/0/Conv', 'input', '/features/1/BatchNormalization_output_0')]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx
from bnnexport.converters.graph import OnnxGraph, attributes
from bnnexport.converters.patterns import SIGN_PRESERVING, binarizations_in, find_binary_layers_in

LAYER_OPS = ("Conv", "MatMul", "Gemm")


@dataclass(frozen=True)
class Unit:
    """One float layer run as one int8 op: the layer node, the BatchNormalization folded into
    it (if any), the Relu fused after it (if any), and its input and output tensors.

    `source` is where its input is quantized: the input itself, or, back through a chain of
    ops TFLite runs in int8 with their input's scale and zero point (pools, reshapes), the
    float tensor before them; `chain` the tensors after each of those ops, the last one the
    input, each quantized with the source's point."""

    layer: str
    op_type: str
    input: str
    output: str
    batch_norm: str | None = None
    relu: str | None = None
    source: str = ""
    chain: tuple[str, ...] = ()
    # its output is read only as signs (by binarizations, through sign-preserving ops): its
    # bias is lowered by half an output step, so the int8 value's sign is the float value's
    # (rounding to the nearest step would make (-step/2, 0) zero, and zero binarizes to +1)
    sign_only: bool = False

    @property
    def start(self) -> str:
        """The tensor where the unit's input is first quantized."""
        return self.source or self.input


@dataclass
class UnitPlan:
    """The units of a graph, in graph order, and every other float layer with why it stays
    float (layer node name -> reason)."""

    units: list[Unit] = field(default_factory=list)
    kept_float: dict[str, str] = field(default_factory=dict)
    # graph outputs no unit writes, quantized all the same (int8 output: `convert --io int8`
    # of a model ending in a binary layer or another float op)
    output_points: list[str] = field(default_factory=list)
    # the node that reads each unit's `start` on the way to the unit (its chain's first op,
    # or the layer), by start tensor
    first_readers: dict[str, set[str]] = field(default_factory=dict)

    def points(self) -> list[str]:
        """The tensors quantized per tensor, each once, in the order the units list them:
        every unit's start, its chain, and its output; then the `output_points`."""
        seen: dict[str, None] = {}
        for unit in self.units:
            for tensor in (unit.start, *unit.chain, unit.output):
                seen.setdefault(tensor)
        for tensor in self.output_points:
            seen.setdefault(tensor)
        return list(seen)

    def shared(self) -> dict[str, str]:
        """Chain tensor -> the start tensor whose point it takes (TFLite's int8 pools and
        reshapes keep their input's scale and zero point)."""
        return {t: unit.start for unit in self.units for t in unit.chain}

    def outputs(self) -> set[str]:
        """The units' outputs, chain tensors and output points: quantized for every reader
        (an int8 op writes them, or the graph's output is int8)."""
        return {unit.output for unit in self.units} | set(self.shared()) | set(self.output_points)

    def readers(self, tensor: str) -> list[str]:
        """The nodes reading `tensor` on the way to a unit: the only readers of its quantized
        copy when it is no unit's output (a residual stream that a float shortcut conv and a
        binarization both read stays float for the binarization)."""
        return sorted(self.first_readers.get(tensor, set()))


# ops TFLite's int8 kernels run with their input's scale and zero point, so its converter
# moves a quantization after them before them (docs/LCE_NOTES.md "int8 around binary layers")
SAME_SCALE = ("AveragePool", "MaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
              "Identity", "Transpose")  # fmt: skip


def _walk_back(graph: OnnxGraph, node: onnx.NodeProto) -> tuple[str, tuple[str, ...], str]:
    """(source, chain, first reader) of a layer's input (`Unit`): back through `SAME_SCALE`
    ops, each read only by the next, to the tensor they start from."""
    tensor, chain, reader = node.input[0], [], _name(node)
    outputs = {o.name for o in graph.outputs}
    while True:
        producer = graph.producer.get(tensor)
        readers = graph.consumers.get(tensor, ())
        if (
            producer is None
            or producer.op_type not in SAME_SCALE
            or len(readers) != 1
            or tensor in outputs
            or graph.const(producer.input[0]) is not None
        ):
            break
        chain.append(tensor)
        tensor, reader = producer.input[0], _name(producer)
    return tensor, tuple(chain[::-1]), reader


def _name(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


def _sole_reader(graph: OnnxGraph, tensor: str, op_type: str) -> onnx.NodeProto | None:
    """The one node reading `tensor`, when it is of `op_type` and `tensor` is no graph output."""
    readers = graph.consumers.get(tensor, ())
    outputs = {o.name for o in graph.outputs}
    if len(readers) == 1 and readers[0].op_type == op_type and tensor not in outputs:
        return readers[0]
    return None


def why_float(graph: OnnxGraph, node: onnx.NodeProto) -> str | None:
    """Why the float layer `node` cannot be an int8 unit, or None when it can."""
    kernel = graph.const(node.input[1]) if len(node.input) > 1 else None
    if kernel is None or kernel.dtype.kind != "f":
        return "its kernel is not a constant"
    if graph.const(node.input[0]) is not None:
        return "its input is a constant"
    attrs = attributes(node)
    if node.op_type == "Conv":
        group = int(attrs.get("group", 1))
        if kernel.ndim != 4:
            return "not a 2-D convolution"
        if group > 1 and not (kernel.shape[1] == 1 and kernel.shape[0] == group):
            return f"a grouped convolution (group={group}) that is not depthwise"
        return None
    if kernel.ndim != 2:
        return f"a {kernel.ndim}-D kernel (int8 takes [in, out] matrices)"
    if node.op_type == "Gemm" and attrs.get("transA", 0):
        return "Gemm with transA=1"
    shape = graph.shape(node.input[0])
    if shape is not None and len(shape) != 2:
        return f"a {len(shape)}-D input (int8 dense layers take [N, features])"
    return None


def _read_as_signs(graph: OnnxGraph, tensor: str, binarizing: set[str]) -> bool:
    """Whether every reader of `tensor` binarizes it (`binarizing`: the first node of each
    binarization pattern) or is a sign-preserving op whose outputs are read so too."""
    readers = graph.consumers.get(tensor, ())
    if not readers or tensor in {o.name for o in graph.outputs}:
        return False
    return all(
        _name(r) in binarizing
        or (r.op_type in SIGN_PRESERVING and _read_as_signs(graph, r.output[0], binarizing))
        for r in readers
    )


def find_units(graph: OnnxGraph, int8_outputs: bool = False) -> UnitPlan:
    """The int8 units of a folded graph (`OnnxGraph.folded`) and the float layers kept float
    (module doc). Layers whose input is binarized and whose kernel is ±1 are binary, not float:
    they are not listed. With `int8_outputs`, every graph output no unit writes is an output
    point too (an int8 output needs a scale)."""
    binary = {m.node_name for m in find_binary_layers_in(graph) if m.binary}
    binarizing = {found.nodes[0] for found in binarizations_in(graph)}
    plan = UnitPlan()
    for node in graph.nodes:
        if node.op_type not in LAYER_OPS or _name(node) in binary:
            continue
        reason = why_float(graph, node)
        if reason is not None:
            plan.kept_float[_name(node)] = reason
            continue
        output, batch_norm, relu = node.output[0], None, None
        found = _sole_reader(graph, output, "BatchNormalization")
        if found is not None and all(graph.const(n) is not None for n in found.input[1:5]):
            batch_norm, output = _name(found), found.output[0]
        found = _sole_reader(graph, output, "Relu")
        if found is not None:
            relu, output = _name(found), found.output[0]
        source, chain, reader = _walk_back(graph, node)
        plan.first_readers.setdefault(source, set()).add(reader)
        unit = Unit(_name(node), node.op_type, node.input[0], output, batch_norm, relu, source)
        signs = relu is None and _read_as_signs(graph, output, binarizing)
        plan.units.append(replace(unit, chain=chain, sign_only=signs))
    if int8_outputs:
        written = plan.outputs()
        plan.output_points = [o.name for o in graph.outputs if o.name not in written]
    return plan
