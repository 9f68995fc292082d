"""Find binary layers in an ONNX model: Conv/MatMul/Gemm whose input is binarized.

The torch exporter writes a binarization with sign(0) = +1 as one of (docs/LCE_NOTES.md,
"PyTorch -> ONNX facts"):

- `Sign(x) -> Add(c) -> Sign` with a constant 0 < c < 1 (`torch.sign(torch.sign(x) + 0.1)`;
  also `Add(c, Sign(x))` and `Sub(Sign(x), -c)`): pattern ``"sign-add-sign"``;
- `Where(GreaterOrEqual(x, 0), 1, -1)` (`torch.where(x >= 0, 1., -1.)`; the branches may be
  full-size constants from `ones_like`), `Where(Not(Less(x, 0)), 1, -1)` and
  `Where(Less(x, 0), -1, 1)`: pattern ``"greaterorequal-where"``.

A layer is binary when such a binarized tensor reaches its data input through shape-only ops
(Identity, Reshape, Flatten, Transpose, Squeeze, Unsqueeze), slicing, max-pooling, or a
constant Pad.
Its kernel is strict when every value is ±1, scaled when it is ±1 times one positive scale per
output channel (the exporter folds BatchNorm into kernels), and offending otherwise.

Only onnx and numpy are used here (no TensorFlow): `bnnexport verify MODEL.onnx` calls it.

Example:
    >>> import onnx
    >>> from bnnexport.converters.patterns import find_binary_layers
    >>> for layer in find_binary_layers(onnx.load("model.onnx")):   # doctest: +SKIP
    ...     print(layer.node_name, layer.op_type, layer.pattern, layer.strict)
    /conv2/Conv Conv sign-add-sign True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from bnnexport.converters.graph import OnnxGraph, attributes

SIGN_ADD_SIGN = "sign-add-sign"
GREATER_OR_EQUAL_WHERE = "greaterorequal-where"

# The one set of sign-preserving ops: each output element is an element of the first input,
# moved or selected (MaxPool: max is monotone), so a ±1 tensor stays ±1 and sign commutes with
# them. The sets below are it, or it with one op added or two left out, for the reason given.
SIGN_PRESERVING = (
    "Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool", "Slice"
)  # fmt: skip
# what a binarized tensor passes through and stays ±1 (a Pad too when its fill is -1, 0 or 1:
# `trace_binarized` checks that)
PASS_THROUGH = SIGN_PRESERVING
# what may stand between a binarization and the layer that reads it when looking for layers
# (lookalikes, the normaliser's passes): any Pad, whose fill matters only once the binarization
# is traced
TO_LAYER = (*SIGN_PRESERVING, "Pad")
# what the translator walks back through, from a binarization's source to a binary conv's
# accumulator, and replays on the tie-broken accumulator (`Translator.binarized_source`): the
# ops its tie-breaking was written and tested for; Transpose and Unsqueeze are not among them,
# so ties behind either are left as the accumulator has them
NUDGE_THROUGH = tuple(op for op in SIGN_PRESERVING if op not in ("Transpose", "Unsqueeze"))
LAYER_OPS = ("Conv", "MatMul", "Gemm")


@dataclass
class Binarization:
    """A binarization pattern: `output` = +1 where `source` >= 0, else -1."""

    pattern: str
    source: str
    output: str
    nodes: list[str]


@dataclass
class BinaryLayerMatch:
    """A Conv/MatMul/Gemm fed by a binarization pattern, and what its kernel holds.

    `kernel` is the constant as stored in ONNX (Conv: [O, I, kh, kw]; MatMul: [I, O];
    Gemm: as stored, see `out_axis`). `scale` is the per-output-channel magnitude when the
    kernel is ±1 times a positive scale, None when strictly ±1 or not binary at all.
    `num_off` counts values that break the pattern and `off_examples` lists a few as
    (index, value).
    """

    node_name: str
    op_type: str
    kernel_name: str
    kernel: np.ndarray
    pattern: str
    scale: np.ndarray | None
    strict: bool
    out_axis: int = 0
    input_name: str = ""
    binarized: str = ""
    num_off: int = 0
    off_examples: list[tuple[tuple[int, ...], float]] = field(default_factory=list)

    @property
    def binary(self) -> bool:
        """True when the kernel is ±1, or ±1 times one positive scale per output channel."""
        return self.strict or self.scale is not None


def _is_const(graph: OnnxGraph, name: str, predicate) -> bool:
    value = graph.const(name)
    return value is not None and value.size > 0 and bool(predicate(np.asarray(value, np.float64)))


def match_binarization(graph: OnnxGraph, name: str) -> Binarization | None:
    """Return the binarization pattern whose output is tensor `name`, if it is one."""
    node = graph.producer.get(name)
    if node is None:
        return None
    if node.op_type == "Sign":
        for op_type, k in ((op, k) for op in ("Add", "Sub") for k in (0, 1)):
            path = graph.match_parent_path(node, [op_type, "Sign"], [0, k])
            if path is None:
                continue
            add, inner = path
            const = add.input[1 - k]
            if add.op_type == "Add":
                ok = _is_const(graph, const, lambda c: np.all((c > 0) & (c < 1)))
            else:  # Sign(x) - c with -1 < c < 0; `c - Sign(x)` flips the sign: not ours
                ok = k == 0 and _is_const(graph, const, lambda c: np.all((c < 0) & (c > -1)))
            if ok:
                nodes = [inner.name, add.name, node.name]
                return Binarization(SIGN_ADD_SIGN, inner.input[0], name, nodes)
        return None
    if node.op_type == "Where":
        positive, negative = node.input[1], node.input[2]
        nodes = [node.name]
        negated = graph.match_parent_path(node, ["Not"], [0])
        if negated is not None:
            nodes.insert(0, negated[0].name)
            positive, negative = negative, positive
        cond = graph.producer.get((negated[0] if negated else node).input[0])
        if cond is None:
            return None
        nodes.insert(0, cond.name)
        # (op, index of the zero constant) -> is the condition "x >= 0" (True) or "x < 0"
        polarity = {
            ("GreaterOrEqual", 1): True,
            ("LessOrEqual", 0): True,
            ("Less", 1): False,
            ("Greater", 0): False,
        }
        for zero_at in (0, 1):
            key = (cond.op_type, zero_at)
            if key in polarity and _is_const(graph, cond.input[zero_at], _all_zero):
                if not polarity[key]:
                    positive, negative = negative, positive
                if _branches(graph, positive, negative):
                    source = cond.input[1 - zero_at]
                    return Binarization(GREATER_OR_EQUAL_WHERE, source, name, nodes)
                return None
    return None


def _all_zero(c: np.ndarray) -> bool:
    return bool(np.all(c == 0))


def _branches(graph: OnnxGraph, positive: str, negative: str) -> bool:
    return _is_const(graph, positive, lambda c: np.all(c == 1)) and _is_const(
        graph, negative, lambda c: np.all(c == -1)
    )


def trace_binarized(graph: OnnxGraph, name: str) -> Binarization | None:
    """Follow `name` back through ±1-preserving ops to a binarization pattern, if any."""
    seen = 0
    while seen < 32:
        found = match_binarization(graph, name)
        if found is not None:
            return found
        node = graph.producer.get(name)
        if node is None:
            return None
        if node.op_type == "Pad":
            mode = attributes(node).get("mode", "constant")
            value = graph.const(node.input[2]) if len(node.input) > 2 and node.input[2] else 0.0
            # one-padding keeps ±1; zero-padding is the conv's zero padding (both binary layers)
            if mode != "constant" or value is None:
                return None
            if float(np.asarray(value).reshape(-1)[0]) not in (-1.0, 0.0, 1.0):
                return None
        elif node.op_type not in PASS_THROUGH:
            return None
        name = node.input[0]
        seen += 1
    return None


def _out_axis(node: onnx.NodeProto, kernel: np.ndarray) -> int | None:
    if node.op_type == "Conv":
        return 0
    if node.op_type == "MatMul":
        return kernel.ndim - 1 if kernel.ndim == 2 else None
    attrs = attributes(node)  # Gemm: Y = alpha * A' B' + beta * C
    if attrs.get("transA", 0) or kernel.ndim != 2:
        return None
    return 0 if attrs.get("transB", 0) else 1


def classify_kernel(
    kernel: np.ndarray, out_axis: int, examples: int = 5
) -> tuple[bool, np.ndarray | None, int, list[tuple[tuple[int, ...], float]]]:
    """Return (strict, scale, num_off, off_examples) for a kernel, see `BinaryLayerMatch`."""
    values = np.asarray(kernel, dtype=np.float64)
    magnitude = np.abs(values)
    if np.all(magnitude == 1.0):
        return True, None, 0, []
    per_channel = np.moveaxis(magnitude, out_axis, 0).reshape(values.shape[out_axis], -1)
    scale = per_channel.max(axis=1) if per_channel.size else np.ones(0)
    finite = np.all(np.isfinite(values))
    if finite and np.all(scale > 0) and np.allclose(per_channel, scale[:, None], rtol=1e-6, atol=0):
        return False, scale.astype(np.float32), 0, []
    off = ~(magnitude == 1.0)
    indices = np.argwhere(off)
    found = [(tuple(int(i) for i in idx), float(values[tuple(idx)])) for idx in indices[:examples]]
    return False, None, int(off.sum()), found


def sign_zeros(match: BinaryLayerMatch) -> int:
    """How many exact zeros a binary layer's kernel holds when it is otherwise ±1, or ±s per
    output channel (what sign(w) gives for a weight with zeros: ternary, not binary); 0 for
    any other kernel. Such a kernel was meant to be binary: the converter refuses to leave it
    float without being told (`--allow-float`)."""
    values = np.moveaxis(np.asarray(match.kernel, np.float64), match.out_axis, 0)
    values = values.reshape(values.shape[0], -1)
    zeros = values == 0
    if match.binary or not zeros.any() or zeros.all():
        return 0
    magnitude = np.abs(values)
    scale = magnitude.max(axis=1, keepdims=True)  # a channel of zeros only: 0, and all zeros
    on_scale = np.isclose(magnitude, scale, rtol=1e-6, atol=0) | zeros
    return int(zeros.sum()) if on_scale.all() and np.isfinite(scale).all() else 0


def find_binary_layers_in(graph: OnnxGraph) -> list[BinaryLayerMatch]:
    """`find_binary_layers` on an already folded graph (`OnnxGraph.folded`)."""
    matches = []
    for node in graph.nodes:
        if node.op_type not in LAYER_OPS or len(node.input) < 2:
            continue
        kernel = graph.const(node.input[1])
        if kernel is None or kernel.dtype.kind != "f":
            continue
        found = trace_binarized(graph, node.input[0])
        if found is None:
            continue
        axis = _out_axis(node, kernel)
        if axis is None:
            continue
        if node.op_type == "Gemm":
            kernel = kernel * np.float32(attributes(node).get("alpha", 1.0))
        strict, scale, num_off, examples = classify_kernel(kernel, axis)
        matches.append(
            BinaryLayerMatch(
                node_name=node.name or node.output[0],
                op_type=node.op_type,
                kernel_name=node.input[1],
                kernel=kernel,
                pattern=found.pattern,
                scale=scale,
                strict=strict,
                out_axis=axis,
                input_name=node.input[0],
                binarized=found.output,
                num_off=num_off,
                off_examples=examples,
            )
        )
    return matches


def binarizations_in(graph: OnnxGraph) -> list[Binarization]:
    """Every binarization pattern of a non-constant tensor, in graph order (a source binarized
    twice is listed twice)."""
    found = []
    for node in graph.nodes:
        for output in node.output:
            match = match_binarization(graph, output) if output else None
            if match is not None and graph.const(match.source) is None:
                found.append(match)
    return found


@dataclass
class LookalikeLayer:
    """A Conv/MatMul/Gemm with a ±1 kernel whose input is sign-like but not a binarization the
    converter recognises (e.g. a plain `Sign`, which maps 0 to 0)."""

    node_name: str
    op_type: str
    seen: str  # the op type found where a binarization was expected


SIGN_LIKE = ("Sign",)


def find_lookalike_layers_in(graph: OnnxGraph) -> list[LookalikeLayer]:
    """Layers that look binary (±1 kernel, sign-like input) but are not binary layers."""
    recognised = {m.node_name for m in find_binary_layers_in(graph)}
    found = []
    for node in graph.nodes:
        name = node.name or node.output[0]
        if node.op_type not in LAYER_OPS or len(node.input) < 2 or name in recognised:
            continue
        kernel = graph.const(node.input[1])
        axis = _out_axis(node, kernel) if kernel is not None and kernel.dtype.kind == "f" else None
        if axis is None or classify_kernel(kernel, axis)[2] != 0:
            continue
        source = node.input[0]
        for _ in range(32):  # back through ±1-preserving ops to what produced the input
            producer = graph.producer.get(source)
            if producer is None or producer.op_type not in TO_LAYER:
                break
            source = producer.input[0]
        if producer is not None and producer.op_type in SIGN_LIKE:
            found.append(LookalikeLayer(name, node.op_type, producer.op_type))
    return found


def find_binary_layers(model: onnx.ModelProto) -> list[BinaryLayerMatch]:
    """Every Conv/MatMul/Gemm fed by a binarization pattern, in graph order.

    Includes layers whose kernel is not ±1 (`strict=False`, `scale=None`, `num_off > 0`), so
    a verifier can report them; `match.binary` tells the ones a converter can make binary.
    """
    return find_binary_layers_in(OnnxGraph.folded(model))
