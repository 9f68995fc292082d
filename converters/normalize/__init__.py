"""The normalising front end: rewrite what real BNN code exports into what the translator knows.

Every exporter writes binarizations, weights and shapes its own way (docs/ARCHITECTURE.md,
"Normalising front end", lists what each writes). `normalize` runs small named passes, registered
with `@rewrite(name)`, until none changes the graph; each pass is exact or leaves the graph as
it is (the translator then names the node it cannot convert):

- ``fix-batch``: a dynamic batch dimension becomes `batch` (1 by default), so shape chains fold;
- ``drop-noise``: `Identity`, `CastLike` to a known type and no-op `Cast` removed (dynamo);
- ``fold-constants``: every node whose inputs are all constant (weights binarized in forward,
  shape chains, Brevitas' clamp + sign) evaluated by ONNX Runtime (the reference evaluator for
  what it lacks), so a folded weight is what ONNX Runtime computes from the original;
- ``qonnx-bipolar``: QONNX `BipolarQuant(x, s)` -> the canonical binarization times `s`;
- ``index-put``: dynamo's `out[mask] = c` (ScatterND at NonZero(mask)) -> Where(mask, c, out);
- ``ste-detach``: the straight-through trick `Add(Sub(S, P), P)` -> `S` (P's subgraph dies);
- ``bitorch-sign``, ``cast-compare``, ``where-compare``: any elementwise function of one tensor
  `x` that reads `x` only through `Sign(x)` and comparisons with 0, and whose value is ±s with
  +s at 0, becomes the canonical `Where(GreaterOrEqual(x, 0), 1, -1)` (times s). Such a function
  depends only on whether x < 0, x == -0.0, x == +0.0 or x > 0, so evaluating it on one value of
  each class (ONNX's reference evaluator) proves the rewrite for every non-NaN input;
- ``plain-sign``: the same functions with another value at 0 (plain `Sign`, `x > 0`) that feed a
  Conv/MatMul/Gemm: rewritten to the canonical form and listed in `zero_sensitive`, so the gate
  can prove that no exact zero reaches them (`converters.lce.check_zero_free`);
- ``clamp-sign``: the canonical binarization of a clamp that keeps sign classes (Clip(x, lo,
  hi) with lo < 0 < hi, Brevitas' `Where(x > s, s, x)`) reads x itself;
- ``pad-transpose``: binarization -> constant `Pad` -> `Transpose` -> layer becomes
  binarization -> `Transpose` -> `Pad` (pads permuted): tf2onnx's one-padded binary convs;
- ``reshape-transpose``: a `Reshape` just before or after a layer's binarization that only
  moves axes of length 1 (tf2onnx's `[N, 1, 1, C] -> [N, C, 1, 1]` before larq-zoo
  BinaryAlexNet's dense layers, written as 1x1 convs) becomes the `Transpose` it equals, which
  the next two passes move and cancel and the translator reads as NHWC -> NCHW;
- ``transpose-binarized``: a `Transpose` or `Reshape` between a binarization and its layer (or
  the layer's Pad) is moved before the binarization (tf2onnx, NHWC), so the binarization feeds
  the layer directly;
- ``keras-prelu``: `Add(Relu(x), Mul(Relu(Neg(x)), c))`, Keras' PReLU as tf2onnx writes it,
  becomes `PRelu(x, -c)`, which the translator emits in the one form TFLite fuses into a single
  PRELU op (docs/LCE_NOTES.md §10);
- ``transpose-sink``: a Transpose moves below a Mul/Add by a constant, and two Transposes that
  undo each other vanish: tf2onnx's NHWC <-> NCHW pairs around each Conv cancel.

Example:
    >>> import onnx
    >>> from onnx import TensorProto, helper
    >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    >>> nodes = [helper.make_node("Sign", ["x"], ["s"]),
    ...          helper.make_node("Constant", [], ["zero"], value_float=0.0),
    ...          helper.make_node("Equal", ["s", "zero"], ["eq"]),
    ...          helper.make_node("Constant", [], ["one"], value_float=1.0),
    ...          helper.make_node("Where", ["eq", "one", "s"], ["y"])]
    >>> model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]))
    >>> normalized, report = normalize(model)
    >>> [n.op_type for n in normalized.graph.node], report.applied["bitorch-sign"]
    (['GreaterOrEqual', 'Where'], 1)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.errors import InvalidModelError
from converters.runtimes import ort_session

ONNX_DOMAINS = ("", "ai.onnx")
QONNX_DOMAINS = ("qonnx.custom_op.general", "finn.custom_op.general")
# one value of each class a Sign/compare-with-0 function can tell apart (see module doc)
PROBES = np.array([-3.0, -1.0, -1e-30, -0.0, 0.0, 1e-30, 1.0, 3.0], np.float32)
NEGATIVE, NEG_ZERO, POS_ZERO, POSITIVE = slice(0, 3), 3, 4, slice(5, 8)
# a sign function may read a non-uniform constant (uninitialised memory it overwrites): every
# distinct value is probed, up to these sizes
MAX_DISTINCT = 1 << 16
MAX_PROBE_VALUES = 1 << 20
COMPARISONS = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
ELEMENTWISE = (
    *COMPARISONS, "Sign", "Not", "And", "Or", "Xor", "Where", "Cast", "CastLike", "Identity",
    "Mul", "Add", "Sub", "Div", "Neg",
)  # fmt: skip
LAYERS = ("Conv", "MatMul", "Gemm")
# ops a ±1 tensor passes on its way to a layer (as in converters.patterns, plus Pad)
PASS_THROUGH = ("Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool",
                "Pad")  # fmt: skip


@dataclass
class NormalizeReport:
    """What `normalize` did: rewrites per pass name, and the canonical binarizations whose
    source maps 0 to something else than +1 in the original graph (source -> what 0 became)."""

    applied: dict[str, int] = field(default_factory=dict)
    zero_sensitive: dict[str, float] = field(default_factory=dict)
    batch: int | None = None  # the batch size fixed in place of a dynamic one


class Work:
    """The graph being normalised: nodes, constants by name, value types and shapes."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        graph = model.graph
        self.opsets = {o.domain: o.version for o in model.opset_import}
        self.consts: dict[str, np.ndarray] = {
            i.name: numpy_helper.to_array(i) for i in graph.initializer
        }
        self.inputs = [i for i in graph.input if i.name not in self.consts]
        self.outputs = list(graph.output)
        self.nodes = list(graph.node)
        self.types: dict[str, onnx.TypeProto] = {}
        # constants the graph held as Constant nodes stay Constant nodes (not initializers):
        # bnnexport's PyTorch twin loads every float initializer by its state-dict name
        self.constant_nodes: set[str] = set()
        # Identity(initializer) outputs: known values, but the node stays (it is how the
        # exporter shares one tensor between two parameters, which the twin splits again)
        self.aliases: set[str] = set()
        self.report = NormalizeReport()
        self._names = 0

    def fresh(self, base: str) -> str:
        self._names += 1
        return f"{base}__n{self._names}"

    def const(self, value: np.ndarray, base: str) -> str:
        name = self.fresh(base)
        self.consts[name] = np.asarray(value)
        return name

    def producers(self) -> dict[str, onnx.NodeProto]:
        return {o: n for n in self.nodes for o in n.output if o}

    def consumers(self) -> dict[str, list[onnx.NodeProto]]:
        out: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for name in node.input:
                if name:
                    out.setdefault(name, []).append(node)
        return out

    def rename_uses(self, old: str, new: str) -> None:
        """Every reader of `old` reads `new` (graph outputs keep their names: see `alias`)."""
        for node in self.nodes:
            node.input[:] = [new if v == old else v for v in node.input]

    def shape(self, name: str) -> list[int | None] | None:
        if name in self.consts:
            return list(self.consts[name].shape)
        found = self.types.get(name)
        if found is None or not found.tensor_type.HasField("shape"):
            return None
        dims = found.tensor_type.shape.dim
        return [d.dim_value if d.HasField("dim_value") else None for d in dims]

    def elem_type(self, name: str) -> int | None:
        if name in self.consts:
            return helper.np_dtype_to_tensor_dtype(self.consts[name].dtype)
        found = self.types.get(name)
        return found.tensor_type.elem_type if found is not None else None

    def build(self, keep_types: bool = False) -> onnx.ModelProto:
        """The current graph as a model, dead nodes and unused constants left out."""
        self.dead_code()
        used = {n for node in self.nodes for n in node.input} | {o.name for o in self.outputs}
        inits = [
            numpy_helper.from_array(v, k)
            for k, v in self.consts.items()
            if k in used and k not in self.constant_nodes and k not in self.aliases
        ]
        nodes = [
            helper.make_node("Constant", [], [k], value=numpy_helper.from_array(self.consts[k], k))
            for k in self.consts
            if k in used and k in self.constant_nodes
        ] + list(self.nodes)
        # a graph output that became a constant is produced by a Constant node
        for out in self.outputs:
            if out.name in self.consts and not any(out.name in n.output for n in nodes):
                value = numpy_helper.from_array(self.consts[out.name], out.name)
                nodes.append(helper.make_node("Constant", [], [out.name], value=value))
                inits = [i for i in inits if i.name != out.name]
        infos = [helper.make_value_info(k, v) for k, v in self.types.items()] if keep_types else []
        graph = helper.make_graph(nodes, self.model.graph.name or "graph", self.inputs,
                                  self.outputs, inits, value_info=infos)  # fmt: skip
        model = helper.make_model(graph, opset_imports=list(self.model.opset_import))
        model.ir_version = self.model.ir_version
        return model

    def infer(self) -> None:
        """Refresh value types and shapes with ONNX shape inference (a help, never required)."""
        model = self.build()
        # large constants (weights) enter as typed inputs: inference needs their shapes, not
        # their values, and the model is built again every round
        graph = model.graph
        large = [i for i in graph.initializer if np.prod(i.dims) > 4096]
        kept = [i for i in graph.initializer if np.prod(i.dims) <= 4096]
        graph.input.extend(
            helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in large
        )
        del graph.initializer[:]
        graph.initializer.extend(kept)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:  # custom domains (QONNX) or odd exporters: keep what we know
            return
        for info in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
            self.types[info.name] = info.type

    def dead_code(self) -> None:
        """Drop nodes no graph output depends on."""
        needed = {o.name for o in self.outputs}
        kept = []
        for node in reversed(self.nodes):
            if any(o in needed for o in node.output):
                kept.append(node)
                needed.update(n for n in node.input if n)
        self.nodes = kept[::-1]


Pass = Callable[[Work], int]
REWRITES: dict[str, Pass] = {}
# passes whose rewrites are labelled inside one routine (the sign-function classifier)
SIGN_IDIOMS = ("bitorch-sign", "cast-compare", "where-compare", "plain-sign")


def rewrite(name: str) -> Callable[[Pass], Pass]:
    """Register a pass under `name` (refusing duplicates); it returns how many rewrites it made."""

    def register(function: Pass) -> Pass:
        if name in REWRITES:
            raise ValueError(f"rewrite {name!r} is registered twice")
        REWRITES[name] = function
        return function

    return register


def _count(work: Work, name: str, n: int = 1) -> None:
    if n:
        work.report.applied[name] = work.report.applied.get(name, 0) + n


@rewrite("fix-batch")
def fix_batch(work: Work, batch: int = 1) -> int:
    """A dynamic first dimension of each input becomes `batch`; other dynamic dims refuse."""
    changed = 0
    for info in work.inputs:
        dims = info.type.tensor_type.shape.dim
        for k, dim in enumerate(dims):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            if k != 0:
                raise InvalidModelError(
                    f"input {info.name!r} has a dynamic dimension {k} "
                    f"({dim.dim_param or '?'}); only the batch dimension may be dynamic"
                )
            dim.Clear()
            dim.dim_value = batch
            work.report.batch = batch
            changed += 1
    return changed


@rewrite("drop-noise")
def drop_noise(work: Work) -> int:
    """Identity nodes, CastLike to a known type, Casts to the type a tensor already has and
    reshapes to the shape it already has (bitorch's view_as)."""
    outputs = {o.name for o in work.outputs}
    initializers = {i.name for i in work.model.graph.initializer}
    changed = 0
    for node in list(work.nodes):
        if node.op_type == "CastLike" and node.domain in ONNX_DOMAINS:
            to = work.elem_type(node.input[1])
            if to:  # CastLike(x, like) is Cast(x, to=type of like)
                node.op_type = "Cast"
                del node.input[1:]
                del node.attribute[:]
                node.attribute.append(helper.make_attribute("to", to))
                changed += 1
        noop_cast = node.op_type == "Cast" and (
            work.elem_type(node.input[0]) is not None
            and work.elem_type(node.input[0]) == helper.get_attribute_value(node.attribute[0])
        )
        noop_reshape = node.op_type in ("Reshape", "Squeeze", "Unsqueeze", "Flatten") and (
            _static(work.shape(node.input[0]))
            and work.shape(node.input[0]) == work.shape(node.output[0])
        )
        shared = node.op_type == "Identity" and node.input[0] in initializers
        removable = (node.op_type == "Identity" and not shared) or noop_cast or noop_reshape
        if removable and node.output[0] not in outputs:
            work.nodes.remove(node)
            work.rename_uses(node.output[0], node.input[0])
            changed += 1
    _count(work, "drop-noise", changed)
    return changed


def _static(shape: list[int | None] | None) -> bool:
    return shape is not None and all(d is not None and d > 0 for d in shape)


def _evaluate(work: Work, node: onnx.NodeProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run one node on constant inputs with ONNX Runtime (the reference the gate compares
    with, so a folded weight is bit for bit what ONNX Runtime computes from the original graph);
    ONNX's reference evaluator for what ONNX Runtime does not run."""
    inputs = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for k, v in feeds.items()
    ]
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph([node], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=list(work.model.opset_import))
    model.ir_version = work.model.ir_version
    try:
        return ort_session(model.SerializeToString(), optimize=False).run(None, feeds)
    except Exception:  # an op or type ONNX Runtime lacks: the reference evaluator
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feeds)


NEVER_FOLD = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
              "Multinomial", "Bernoulli")  # fmt: skip


def _kernel_layout(node: onnx.NodeProto, initializers: set[str], consumers: dict) -> bool:
    """A layout op on a stored weight that only layers read as their kernel (the legacy
    exporter's `Transpose(W)` before MatMul). Left in place: the translator reads through it,
    and the weight keeps its state-dict name, by which PyTorch's exact-grid twin loads it."""
    readers = consumers.get(node.output[0], []) if node.output else []
    return (
        node.op_type in ("Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten")
        and node.input[0] in initializers
        and bool(readers)
        and all(r.op_type in LAYERS and list(r.input).index(node.output[0]) == 1 for r in readers)
    )


@rewrite("fold-constants")
def fold_constants(work: Work) -> int:
    """Replace every node whose inputs are all constant by its value (and `Shape` of a tensor
    whose shape is static by that shape)."""
    changed = 0
    initializers = {i.name for i in work.model.graph.initializer}
    consumers = work.consumers()
    for node in list(work.nodes):
        if node.domain not in ONNX_DOMAINS or node.op_type in NEVER_FOLD:
            continue
        if _kernel_layout(node, initializers, consumers):
            continue
        if node.op_type == "Identity" and node.input[0] in initializers:
            if node.output[0] not in work.consts:
                work.consts[node.output[0]] = work.consts[node.input[0]]
                work.aliases.add(node.output[0])
            continue
        if node.op_type == "Shape":
            shape = work.shape(node.input[0])
            if shape is None or any(d is None or d <= 0 for d in shape):
                continue
            start = next((a.i for a in node.attribute if a.name == "start"), 0)
            end = next((a.i for a in node.attribute if a.name == "end"), len(shape))
            values = [np.asarray(shape[start:end], np.int64)]
        elif node.op_type == "Constant" or (
            node.input and all(not n or n in work.consts for n in node.input)
        ):
            feeds = {n: work.consts[n] for n in node.input if n}
            try:
                values = _evaluate(work, node, feeds)
            except Exception:  # the translator reports what it cannot do, by node name
                continue
        else:
            continue
        for name, value in zip([o for o in node.output if o], values, strict=False):
            work.consts[name] = np.asarray(value)
            if node.op_type == "Constant":
                work.constant_nodes.add(name)
        work.nodes.remove(node)
        changed += 1
    _count(work, "fold-constants", changed)
    return changed


def _canonical(work: Work, source: str, output: str, scale: float = 1.0) -> list[onnx.NodeProto]:
    """`output` = Where(GreaterOrEqual(source, 0), 1, -1) (times `scale` when it is not 1)."""
    zero = work.const(np.array(0.0, np.float32), "zero")
    one = work.const(np.array(1.0, np.float32), "one")
    minus = work.const(np.array(-1.0, np.float32), "minus_one")
    cond = work.fresh(f"{source}__ge0")
    signed = output if scale == 1.0 else work.fresh(f"{source}__sign")
    nodes = [
        helper.make_node("GreaterOrEqual", [source, zero], [cond], name=work.fresh("binarize")),
        helper.make_node("Where", [cond, one, minus], [signed], name=work.fresh("binarize")),
    ]
    if scale != 1.0:
        s = work.const(np.array(scale, np.float32), "scale")
        nodes.append(helper.make_node("Mul", [signed, s], [output], name=work.fresh("scale")))
    return nodes


def _replace(work: Work, old: onnx.NodeProto, new: list[onnx.NodeProto]) -> None:
    """Put `new` where `old` was (it produces the same output name)."""
    at = work.nodes.index(old)
    work.nodes[at : at + 1] = new


@rewrite("qonnx-bipolar")
def qonnx_bipolar(work: Work) -> int:
    """QONNX BipolarQuant(x, scale): +1 where x >= 0, else -1, times scale (a scalar)."""
    changed = 0
    for node in list(work.nodes):
        if node.op_type != "BipolarQuant" or node.domain not in QONNX_DOMAINS:
            continue
        scale = work.consts.get(node.input[1]) if len(node.input) > 1 else np.float32(1.0)
        if scale is None or np.asarray(scale).size != 1 or not float(np.ravel(scale)[0]) > 0:
            continue  # a per-channel or computed scale: left for the translator to refuse
        _replace(work, node, _canonical(work, node.input[0], node.output[0],
                                        float(np.ravel(scale)[0])))  # fmt: skip
        changed += 1
    _count(work, "qonnx-bipolar", changed)
    return changed


@rewrite("index-put")
def index_put(work: Work) -> int:
    """`out[mask] = c` as the dynamo exporter writes it, ScatterND(data,
    Transpose(NonZero(mask)), Reshape(Expand(c, count))), is Where(mask, c, data) when c is
    one constant value and the mask covers all of data's dimensions."""
    producers = work.producers()
    changed = 0
    for node in list(work.nodes):
        if node.op_type != "ScatterND" or any(a.s not in (b"", b"none") for a in node.attribute):
            continue
        data, indices, updates = node.input[:3]
        transpose = producers.get(indices)
        nonzero = producers.get(transpose.input[0]) if transpose is not None else None
        if transpose is None or transpose.op_type != "Transpose" or nonzero is None:
            continue
        perm = [list(a.ints) for a in transpose.attribute if a.name == "perm"]
        if nonzero.op_type != "NonZero" or perm != [[1, 0]]:
            continue
        mask = nonzero.input[0]
        value = _uniform_update(work, updates, producers)
        if value is None or work.shape(mask) is None or work.shape(mask) != work.shape(data):
            continue
        dtype = helper.tensor_dtype_to_np_dtype(work.elem_type(data) or onnx.TensorProto.FLOAT)
        c = work.const(np.asarray(value, dtype), "put_value")
        _replace(work, node, [helper.make_node("Where", [mask, c, data], [node.output[0]],
                                               name=work.fresh("index_put"))])  # fmt: skip
        changed += 1
    _count(work, "index-put", changed)
    return changed


def _uniform_update(work: Work, name: str, producers: dict) -> np.ndarray | None:
    """The one value of an update tensor built as Reshape/Expand of a uniform constant."""
    for _ in range(4):
        if name in work.consts:
            value = np.asarray(work.consts[name])
            if value.size and np.all(value == value.reshape(-1)[0]):
                return value.reshape(-1)[0]
            return None
        node = producers.get(name)
        if node is None or node.op_type not in ("Reshape", "Expand", "Identity"):
            return None
        name = node.input[0]
    return None


@rewrite("ste-detach")
def ste_detach(work: Work) -> int:
    """`s.detach() - p.detach() + p` (ReActNet, Bi-Real, IR-Net code) exports as
    Add(Sub(S, P), P): its forward value is S (up to the rounding of (S - P) + P, which is what
    the trick means), so readers of the Add read S and P's subgraph dies."""
    producers = work.producers()
    changed = 0
    for node in list(work.nodes):
        if node.op_type != "Add" or any(n in work.consts for n in node.input):
            continue
        for k in (0, 1):
            sub = producers.get(node.input[k])
            if sub is not None and sub.op_type == "Sub" and sub.input[1] == node.input[1 - k]:
                if node.output[0] in {o.name for o in work.outputs}:
                    break
                work.nodes.remove(node)
                work.rename_uses(node.output[0], sub.input[0])
                changed += 1
                break
    _count(work, "ste-detach", changed)
    return changed


@rewrite("keras-prelu")
def keras_prelu(work: Work) -> int:
    """Add(Relu(x), Mul(Relu(Neg(x)), c)) -> PRelu(x, -c), c a constant (either operand order).

    Equal for every non-NaN x: for x < 0 the sum is 0 + (-x) * c = x * (-c) (negation is
    exact), for x >= 0 it is x + 0 * c = x. Only the sign of a zero result may differ, and the
    original leaves that to how a runtime's Relu treats -0.0.
    """
    producers = work.producers()
    changed = 0
    for node in list(work.nodes):
        match = _keras_prelu_match(work, node, producers) if node.op_type == "Add" else None
        if match is None:
            continue
        x, c = match
        slope = work.const(np.negative(c).astype(np.float32), "prelu_slope")
        prelu = helper.make_node("PRelu", [x, slope], [node.output[0]], name=work.fresh("prelu"))
        _replace(work, node, [prelu])
        changed += 1
    _count(work, "keras-prelu", changed)
    return changed


def _keras_prelu_match(
    work: Work, add: onnx.NodeProto, producers: dict
) -> tuple[str, np.ndarray] | None:
    """(x, c) when `add` is Add(Relu(x), Mul(Relu(Neg(x)), c)) in any operand order."""
    for k in (0, 1):
        relu, mul = producers.get(add.input[k]), producers.get(add.input[1 - k])
        if relu is None or mul is None or relu.op_type != "Relu" or mul.op_type != "Mul":
            continue
        for j in (0, 1):
            c = work.consts.get(mul.input[1 - j])
            inner = producers.get(mul.input[j])
            if c is None or c.dtype != np.float32 or inner is None or inner.op_type != "Relu":
                continue
            neg = producers.get(inner.input[0])
            if neg is not None and neg.op_type == "Neg" and neg.input[0] == relu.input[0]:
                return relu.input[0], c
    return None


def _sign_function(
    work: Work, root: str, producers: dict[str, onnx.NodeProto]
) -> tuple[str, list[onnx.NodeProto], dict[str, np.ndarray]] | None:
    """(x, nodes, scalar constants) when `root` is an elementwise function of one tensor x that
    reads x only through Sign and comparisons with a constant 0 (see the module doc).

    The walk stops at the input of every Sign and of every comparison with 0 (unless that input
    is itself a Sign's output, as in bitorch's `Equal(Sign(x), 0)`): those inputs are x, and
    must all be the same tensor. Any other non-constant tensor reached means the function reads
    a value, not a sign class, and is not one of these."""
    nodes: dict[int, onnx.NodeProto] = {}
    consts: dict[str, np.ndarray] = {}
    leaves: set[str] = set()
    stack = [root]
    while stack:
        name = stack.pop()
        if name in work.consts:
            value = np.asarray(work.consts[name])
            if value.size == 0:
                return None
            if np.all(value == value.reshape(-1)[0]):
                consts[name] = value.reshape(-1)[0:1].reshape(())
            else:  # e.g. `x.new(x.size())`'s uninitialised memory, overwritten by index-puts
                distinct = np.unique(value.reshape(-1))
                if distinct.size > MAX_DISTINCT:
                    return None
                consts[name] = distinct  # 1-D: `_probe` tries every value
            continue
        node = producers.get(name)
        if node is None or node.op_type not in ELEMENTWISE or node.domain not in ONNX_DOMAINS:
            return None  # a value read directly, not through a sign or a comparison
        if id(node) in nodes:
            continue
        nodes[id(node)] = node
        if node.op_type == "Sign":
            leaves.add(node.input[0])
        elif node.op_type in COMPARISONS:
            zero = [n for n in node.input if n in work.consts]
            other = [n for n in node.input if n not in work.consts]
            if len(zero) != 1 or len(other) != 1 or np.any(work.consts[zero[0]] != 0):
                return None
            consts[zero[0]] = np.asarray(work.consts[zero[0]]).reshape(-1)[0:1].reshape(())
            inner = producers.get(other[0])
            if inner is not None and inner.op_type == "Sign":
                stack.append(other[0])
            else:
                leaves.add(other[0])
        else:
            stack.extend(n for n in node.input if n)
    if len(leaves) != 1 or root in leaves:
        return None
    (x,) = leaves
    shape_x = work.shape(x)
    for name in consts:  # scalarising a constant must not hide a broadcast that grows x
        full = work.consts[name].shape
        if shape_x is None or None in shape_x:
            if work.consts[name].size != 1:
                return None
        elif tuple(np.broadcast_shapes(tuple(shape_x), full)) != tuple(shape_x):
            return None
    order = {id(n): k for k, n in enumerate(work.nodes)}
    return x, sorted(nodes.values(), key=lambda n: order[id(n)]), consts


def _probe(work: Work, x: str, nodes: list[onnx.NodeProto], consts: dict, root: str):
    """The function's values on PROBES (ONNX's reference evaluator), or None.

    A constant given as a 1-D array of its distinct values (`_sign_function`) gets an axis of
    its own, so every combination of their values is evaluated; the function is one of these
    only if its value does not depend on them (None otherwise)."""
    from onnx.reference import ReferenceEvaluator

    varying = [k for k, v in consts.items() if np.ndim(v) == 1]
    rank = 1 + len(varying)
    if np.prod([consts[k].size for k in varying] or [1]) * len(PROBES) > MAX_PROBE_VALUES:
        return None
    feeds = {}
    for k, v in consts.items():
        axis = 1 + varying.index(k) if k in varying else None
        shape = [1] * rank
        if axis is not None:
            shape[axis] = v.size
        feeds[k] = np.asarray(v).reshape(shape if axis is not None else ())
    probes = PROBES.reshape([len(PROBES)] + [1] * (rank - 1))
    graph = helper.make_graph(
        nodes, "probe",
        [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, list(probes.shape))],
        [helper.make_empty_tensor_value_info(root)],
        [numpy_helper.from_array(v, k) for k, v in feeds.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=list(work.model.opset_import))
    try:
        (out,) = ReferenceEvaluator(model).run(None, {x: probes})
    except Exception:
        return None
    out = np.asarray(out, np.float64)
    if out.ndim != rank or out.shape[0] != len(PROBES):
        return None
    table = np.broadcast_to(out, out.shape).reshape(len(PROBES), -1)
    if not all(
        np.array_equal(table[:, 0], table[:, j], equal_nan=True) for j in range(1, table.shape[1])
    ):
        return None  # its value depends on a non-uniform constant
    return table[:, 0]


def _is_canonical(work: Work, node: onnx.NodeProto, producers: dict) -> bool:
    """Already a form the translator binarizes (converters.patterns): leave it as it is."""
    if node.op_type == "Where":
        cond = producers.get(node.input[0])
        branches = [work.consts.get(n) for n in node.input[1:]]
        return (
            cond is not None and cond.op_type == "GreaterOrEqual"
            and np.asarray(work.consts.get(cond.input[1], 1)).size == 1
            and work.consts.get(cond.input[1]) is not None
            and float(np.ravel(work.consts[cond.input[1]])[0]) == 0.0
            and all(b is not None for b in branches)
            and np.all(branches[0] == 1) and np.all(branches[1] == -1)
        )  # fmt: skip
    if node.op_type == "Sign":  # Sign(Add(Sign(x), c)): the sign-add-sign pattern
        add = producers.get(node.input[0])
        return (
            add is not None
            and add.op_type in ("Add", "Sub")
            and any(
                producers.get(n) is not None and producers[n].op_type == "Sign" for n in add.input
            )
        )
    return False


def _feeds_layer(work: Work, name: str, consumers: dict) -> bool:
    """Does tensor `name` reach a Conv/MatMul/Gemm data input through ±1-preserving ops?"""
    stack, seen = [name], set()
    while stack:
        current = stack.pop()
        for reader in consumers.get(current, []):
            if reader.op_type in LAYERS and reader.input[0] == current:
                return True
            if reader.op_type in PASS_THROUGH and reader.input[0] == current:
                if reader.output[0] not in seen:
                    seen.add(reader.output[0])
                    stack.append(reader.output[0])
    return False


def _label(nodes: list[onnx.NodeProto], exact: bool) -> str:
    ops = {n.op_type for n in nodes}
    if not exact:
        return "plain-sign"
    if "Sign" in ops and "Equal" in ops:
        return "bitorch-sign"
    if "Cast" in ops:
        return "cast-compare"
    return "where-compare"


def sign_idioms(work: Work, enabled: Iterable[str]) -> int:
    """Rewrite sign functions (module doc) to the canonical form, outermost first."""
    enabled = set(enabled)
    changed = 0
    done: set[str] = set()
    while True:
        producers, consumers = work.producers(), work.consumers()
        found = None
        for node in reversed(work.nodes):
            out = node.output[0] if node.output else ""
            if (
                not out or out in done or node.op_type not in ELEMENTWISE
                or _is_canonical(work, node, producers)
            ):  # fmt: skip
                continue
            match = _sign_function(work, out, producers)
            if match is None:
                continue
            x, nodes, consts = match
            values = _probe(work, x, nodes, consts, out)
            done.add(out)
            if values is None:
                continue
            negative, positive = values[NEGATIVE], values[POSITIVE]
            s = positive[0]
            if not (np.all(positive == s) and np.all(negative == -s) and s > 0):
                continue
            zeros = values[[NEG_ZERO, POS_ZERO]]
            exact = bool(np.all(zeros == s))
            label = _label(nodes, exact)
            if label not in enabled or (not exact and not _feeds_layer(work, out, consumers)):
                continue
            found = (node, x, out, float(s), exact, label, zeros)
            break
        if found is None:
            return changed
        node, x, out, s, exact, label, zeros = found
        _replace(work, node, _canonical(work, x, out, s))
        if not exact:
            work.report.zero_sensitive[x] = float(zeros[1])
        _count(work, label)
        work.dead_code()
        changed += 1


def _scalar(work: Work, name: str) -> float | None:
    value = work.consts.get(name) if name else None
    if value is None or np.asarray(value).size != 1:
        return None
    return float(np.ravel(value)[0])


def _unclamped(work: Work, node: onnx.NodeProto | None) -> str | None:
    """x when `node` clamps x into a range around 0 that keeps every sign class (x < 0 stays
    < 0, zeros stay zeros, x > 0 stays > 0), else None."""
    if node is None:
        return None
    if node.op_type == "Clip" and len(node.input) >= 1:
        lo = _scalar(work, node.input[1]) if len(node.input) > 1 and node.input[1] else -np.inf
        hi = _scalar(work, node.input[2]) if len(node.input) > 2 and node.input[2] else np.inf
        for a in node.attribute:  # opset < 11 keeps the bounds as attributes
            lo, hi = (a.f, hi) if a.name == "min" else (lo, a.f) if a.name == "max" else (lo, hi)
        ok = lo is not None and hi is not None and lo < 0 < hi
        return node.input[0] if ok else None
    if node.op_type in ("Min", "Max") and len(node.input) == 2:
        for k in (0, 1):
            c = _scalar(work, node.input[1 - k])
            if c is not None and node.input[k] not in work.consts:
                ok = c > 0 if node.op_type == "Min" else c < 0
                return node.input[k] if ok else None
        return None
    if node.op_type == "Where":
        producers = work.producers()
        cond = producers.get(node.input[0])
        if cond is None or cond.op_type not in ("Greater", "GreaterOrEqual", "Less", "LessOrEqual"):
            return None
        x, bound = cond.input
        c, branch = _scalar(work, bound), _scalar(work, node.input[1])
        if c is None or branch != c or node.input[2] != x or x in work.consts:
            return None  # Where(x > c, c, x): min(x, c); Where(x < c, c, x): max(x, c)
        above = cond.op_type.startswith("Greater")
        return x if (c > 0 if above else c < 0) else None
    return None


@rewrite("clamp-sign")
def clamp_sign(work: Work) -> int:
    """A canonical binarization of clamp(x) (Clip, Min/Max, or Brevitas' Where(x > s, s, x))
    reads x instead: the clamps here keep every sign class, so the binarization is the same."""
    producers = work.producers()
    changed = 0
    for node in list(work.nodes):
        if node.op_type != "Where" or not _is_canonical(work, node, producers):
            continue
        cond = producers[node.input[0]]
        while True:
            inner = _unclamped(work, producers.get(cond.input[0]))
            if inner is None:
                break
            # a plain Sign's zeros are x's zeros: the zero-free check follows the source
            zero = work.report.zero_sensitive.pop(cond.input[0], None)
            if zero is not None:
                work.report.zero_sensitive.setdefault(inner, zero)
            cond.input[0] = inner
            changed += 1
    _count(work, "clamp-sign", changed)
    return changed


def _binarized_source(node: onnx.NodeProto, producers: dict) -> str:
    """x of a canonical binarization (`_is_canonical`): Where(GreaterOrEqual(x, 0), 1, -1) or
    Sign(Add(Sign(x), c))."""
    inner = producers[node.input[0]]
    if node.op_type == "Where":
        return inner.input[0]
    sign = next(producers[n] for n in inner.input if n in producers and
                producers[n].op_type == "Sign")  # fmt: skip
    return sign.input[0]


def _pad_spec(work: Work, node: onnx.NodeProto) -> list[int] | None:
    """The pads of a constant-mode Pad whose pads and fill value are constants (the fill left
    where it is), or None: any other Pad (reflect/edge, computed pads, negative pads that
    crop, an `axes` input) is not one `pad_transpose` can move."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("mode", b"constant") not in (b"constant", "constant"):
        return None
    if len(node.input) > 3 and node.input[3]:
        return None
    if len(node.input) > 2 and node.input[2] and _scalar(work, node.input[2]) is None:
        return None
    if len(node.input) > 1 and node.input[1]:
        pads = work.consts.get(node.input[1])
    else:  # opset < 11: pads (and the value) are attributes
        pads = attrs.get("pads")
    if pads is None:
        return None
    pads = np.asarray(pads)
    if pads.dtype.kind not in "iu" or pads.ndim != 1 or np.any(pads < 0):
        return None
    return [int(p) for p in pads]


@rewrite("pad-transpose")
def pad_transpose(work: Work) -> int:
    """Binarize -> constant Pad -> Transpose(perm) -> layer becomes Binarize -> Transpose(perm)
    -> Pad with the pads permuted by perm: output axis k of the Transpose is input axis
    perm[k], so it gets that axis' pads, and the fill is the same everywhere. tf2onnx writes
    larq's one-padded binary convs (QuickNet) so, with the Pad on the NHWC tensor; once the
    Transpose is next to the binarization, `transpose-binarized` moves it above, and the
    translator finds binarize -> Pad on NCHW spatial axes -> Conv, a form it emits as binary.
    Only Pads after a binarization on the way to a layer move: float Pads keep the form the
    translator already reads."""
    producers, consumers = work.producers(), work.consumers()
    changed = 0
    for node in list(work.nodes):
        perm = _perm(node) if node.op_type == "Transpose" else None
        pad = producers.get(node.input[0]) if perm is not None else None
        if pad is None or pad.op_type != "Pad" or pad.domain not in ONNX_DOMAINS:
            continue
        pads = _pad_spec(work, pad)
        rank = len(perm)
        if pads is None or len(pads) != 2 * rank or sorted(perm) != list(range(rank)):
            continue
        if len(consumers.get(pad.output[0], [])) != 1 or pad.output[0] in {
            o.name for o in work.outputs
        }:
            continue
        binarization = producers.get(pad.input[0])
        if binarization is None or not _is_canonical(work, binarization, producers):
            continue
        if not _feeds_layer(work, node.output[0], consumers):
            continue
        moved = [pads[perm[k]] for k in range(rank)] + [pads[rank + perm[k]] for k in range(rank)]
        transposed = work.fresh(f"{pad.input[0]}__transposed")
        shifted = helper.make_node("Transpose", [pad.input[0]], [transposed], perm=perm,
                                   name=work.fresh("Transpose"))  # fmt: skip
        inputs = [transposed, *pad.input[1:]]
        padded = helper.make_node("Pad", inputs, [node.output[0]], name=work.fresh("Pad"))
        padded.attribute.extend(a for a in pad.attribute if a.name != "pads")
        if len(pad.input) > 1 and pad.input[1]:
            padded.input[1] = work.const(np.asarray(moved, np.int64), f"{pad.input[1]}__moved")
        else:
            padded.attribute.append(helper.make_attribute("pads", moved))
        _replace(work, node, [shifted, padded])
        work.nodes.remove(pad)
        changed += 1
        producers, consumers = work.producers(), work.consumers()
    _count(work, "pad-transpose", changed)
    return changed


def _reshape_target(work: Work, node: onnx.NodeProto) -> list[int] | None:
    """The output shape of a Reshape whose input shape is static and whose target is a
    constant (0 copies the input's dim unless `allowzero`, -1 takes what is left), or None."""
    source = work.shape(node.input[0])
    target = work.consts.get(node.input[1]) if len(node.input) > 1 else None
    if not _static(source) or target is None or np.asarray(target).ndim != 1:
        return None
    allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
    dims = [int(d) for d in np.asarray(target)]
    if allowzero and 0 in dims:
        return None  # a zero-sized tensor: nothing a layer reads
    dims = [source[k] if d == 0 and k < len(source) else d for k, d in enumerate(dims)]
    if dims.count(-1) > 1 or any(d < -1 or d == 0 for d in dims):
        return None
    total, known = int(np.prod(source)), int(np.prod([d for d in dims if d != -1]))
    if -1 in dims:
        if known == 0 or total % known:
            return None
        dims[dims.index(-1)] = total // known
    return dims if int(np.prod(dims)) == total else None


def _unit_perm(source: list[int], target: list[int]) -> list[int] | None:
    """The perm of a Transpose equal to reshaping `source` to `target`, or None. Row-major
    order only sees the axes longer than 1, so when those keep their order (and the rank is the
    same) the reshape only moves unit axes: non-unit output axes take the non-unit input axes
    in order, unit output axes the unit input axes in order."""
    if len(source) != len(target):
        return None
    big_in = [k for k, d in enumerate(source) if d != 1]
    big_out = [k for k, d in enumerate(target) if d != 1]
    if [source[k] for k in big_in] != [target[k] for k in big_out]:
        return None
    units = iter(k for k, d in enumerate(source) if d == 1)
    bigs = iter(big_in)
    return [next(bigs) if d != 1 else next(units) for d in target]


@rewrite("reshape-transpose")
def reshape_transpose(work: Work) -> int:
    """Binarize -> Reshape -> layer, or Reshape -> Binarize -> layer, where the Reshape only
    moves axes of length 1 (tf2onnx's `[N, 1, 1, C] -> [N, C, 1, 1]` before larq-zoo
    BinaryAlexNet's 1x1 binary convs on a 1x1 input, its dense layers), becomes the Transpose
    it equals: the same data, and a form `transpose-binarized` and `transpose-sink` move and
    cancel, and the translator reads as NHWC -> NCHW, as for the other NHWC convs. Both orders,
    because the shapes often become static only after `fold-constants` (tf2onnx computes a
    Keras Reshape's target from `Shape`), by when `transpose-binarized` has moved the Reshape
    above the binarization. Only with a static input shape and a constant target; a Reshape
    that reorders data (two axes longer than 1 swap places) or changes the rank stays."""
    producers, consumers = work.producers(), work.consumers()
    # the tensors binarized on their way to a layer (the rewrite below keeps every name)
    binarized = {
        _binarized_source(b, producers)
        for b in work.nodes
        if _is_canonical(work, b, producers) and _feeds_layer(work, b.output[0], consumers)
    }
    changed = 0
    for node in list(work.nodes):
        if node.op_type != "Reshape" or node.domain not in ONNX_DOMAINS:
            continue
        where = producers.get(node.input[0])
        after = where is not None and _is_canonical(work, where, producers)
        if not (after and _feeds_layer(work, node.output[0], consumers)) and (
            node.output[0] not in binarized
        ):
            continue
        target = _reshape_target(work, node)
        perm = _unit_perm(work.shape(node.input[0]), target) if target is not None else None
        if perm is None or perm == list(range(len(perm))):
            continue
        moved = helper.make_node("Transpose", [node.input[0]], [node.output[0]], perm=perm,
                                 name=work.fresh("Transpose"))  # fmt: skip
        _replace(work, node, [moved])
        changed += 1
    _count(work, "reshape-transpose", changed)
    return changed


@rewrite("transpose-binarized")
def transpose_binarized(work: Work) -> int:
    """Binarize(x) -> Transpose/Reshape -> layer (or -> Pad -> layer) becomes
    Transpose/Reshape(x) -> Binarize -> layer: the binarization is elementwise, so both orders
    give the same tensor, and the translator then sees the binarization right before the
    layer's data input (or its Pad)."""
    producers, consumers = work.producers(), work.consumers()
    changed = 0
    for node in list(work.nodes):
        if node.op_type not in ("Transpose", "Reshape"):
            continue
        where = producers.get(node.input[0])
        if where is None or not _is_canonical(work, where, producers):
            continue
        if len(consumers.get(where.output[0], [])) != 1:
            continue
        readers = consumers.get(node.output[0], [])
        # directly, or through a Pad (after `pad-transpose`): forms the translator emits
        padded = [p.output[0] for p in readers if p.op_type == "Pad" and len(readers) == 1]
        readers = [*readers, *(r for p in padded for r in consumers.get(p, []))]
        if not any(r.op_type in LAYERS for r in readers):
            continue
        source = _binarized_source(where, producers)
        moved = work.fresh(f"{source}__moved")
        shifted = helper.make_node(node.op_type, [source, *node.input[1:]], [moved],
                                   name=work.fresh(node.op_type))  # fmt: skip
        shifted.attribute.extend(node.attribute)
        _replace(work, node, [shifted, *_canonical(work, moved, node.output[0])])
        changed += 1
        producers, consumers = work.producers(), work.consumers()
    _count(work, "transpose-binarized", changed)
    return changed


def runnable_reference(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model ONNX Runtime runs as the reference: None when it runs the original as it is;
    for QONNX models, the original with each BipolarQuant written out in standard ONNX ops by
    its definition (`qonnx_bipolar`), nothing else changed."""
    if not any(n.domain in QONNX_DOMAINS for n in model.graph.node):
        return None
    work = Work(onnx.ModelProto.FromString(model.SerializeToString()))
    qonnx_bipolar(work)
    built = work.build()
    del built.opset_import[:]
    built.opset_import.extend(o for o in model.opset_import if o.domain not in QONNX_DOMAINS)
    return built


def _inverse(perm: list[int]) -> list[int]:
    return [perm.index(k) for k in range(len(perm))]


def _perm(node: onnx.NodeProto) -> list[int] | None:
    found = [list(a.ints) for a in node.attribute if a.name == "perm"]
    return found[0] if found else None


@rewrite("transpose-sink")
def transpose_sink(work: Work) -> int:
    """Move a Transpose after a Mul/Add/Sub/Div by a constant (tf2onnx's BatchNorm on NHWC)
    below it, with the constant transposed to match, and drop two Transposes that undo each
    other: tf2onnx's NHWC <-> NCHW pairs around every Conv cancel, and the constants become
    per-channel on ONNX's channel axis, where the translator fuses them into the binary conv."""
    changed = 0
    outputs = {o.name for o in work.outputs}
    progress = True
    while progress:
        progress = False
        consumers = work.consumers()
        for node in list(work.nodes):
            if node.op_type != "Transpose" or node.output[0] in outputs:
                continue
            perm, readers = _perm(node), consumers.get(node.output[0], [])
            if perm is None or len(readers) != 1:
                continue
            (reader,) = readers
            if reader.output[0] in outputs:
                continue
            if reader.op_type == "Transpose" and _perm(reader) == _inverse(perm):
                work.nodes.remove(reader)
                work.rename_uses(reader.output[0], node.input[0])
                work.nodes.remove(node)  # its only reader is gone
                changed, progress = changed + 1, True
                break
            if reader.op_type not in ("Mul", "Add", "Sub", "Div"):
                continue
            k = list(reader.input).index(node.output[0])
            other = reader.input[1 - k]
            if other not in work.consts or work.consts[other].ndim > len(perm):
                continue
            value = work.consts[other]
            value = value.reshape((1,) * (len(perm) - value.ndim) + value.shape)
            moved = work.const(np.transpose(value, _inverse(perm)), f"{other}__moved")
            inner = work.fresh(f"{reader.output[0]}__before")
            operands = [node.input[0], moved] if k == 0 else [moved, node.input[0]]
            # the reader becomes the op on the untransposed tensor, the Transpose follows it
            at = work.nodes.index(reader)
            work.nodes[at : at + 1] = [
                helper.make_node(reader.op_type, operands, [inner], name=work.fresh("sunk")),
                helper.make_node("Transpose", [inner], [reader.output[0]], perm=perm,
                                 name=work.fresh("Transpose")),
            ]  # fmt: skip
            work.nodes.remove(node)
            changed, progress = changed + 1, True
            break
    _count(work, "transpose-sink", changed)
    return changed


def normalize(
    model: onnx.ModelProto,
    batch: int = 1,
    disabled: Iterable[str] = (),
    max_rounds: int = 64,
) -> tuple[onnx.ModelProto, NormalizeReport]:
    """Run every enabled pass until none changes the graph; (normalised model, report).

    The result is checked valid (`check_valid`) before anything reads it; when it is not, the
    passes are run again, checked one at a time, to name the one that made a valid graph
    invalid (InvalidModelError, one line).

    Args:
        model: any ONNX model (left unchanged).
        batch: the batch size fixed in place of a dynamic batch dimension.
        disabled: pass names to skip (see `REWRITES`); used to show what each one is for.
    """
    disabled = set(disabled)
    unknown = disabled - set(REWRITES)
    if unknown:
        raise ValueError(f"unknown rewrite(s) {sorted(unknown)}; known: {sorted(REWRITES)}")
    normalized, report = _run(model, batch, disabled, max_rounds)
    if check_valid(normalized, report) is not None:
        _name_the_broken_pass(model, batch, disabled, max_rounds)
    return normalized, report


def _run(
    model: onnx.ModelProto,
    batch: int,
    disabled: set[str],
    max_rounds: int,
    after: Callable[[str, Work], None] | None = None,
) -> tuple[onnx.ModelProto, NormalizeReport]:
    """The passes to a fixpoint; `after(name, work)` is called after each pass that changed
    the graph."""
    work = Work(onnx.ModelProto.FromString(model.SerializeToString()))

    def ran(name: str, changed: int) -> int:
        if changed and after is not None:
            after(name, work)
        return changed

    if "fix-batch" not in disabled:
        ran("fix-batch", fix_batch(work, batch))
    idioms = [n for n in SIGN_IDIOMS if n not in disabled]
    for _ in range(max_rounds):
        work.infer()
        changed = 0
        for name in ("drop-noise", "fold-constants", "qonnx-bipolar", "index-put", "ste-detach",
                     "keras-prelu"):  # fmt: skip
            if name not in disabled:
                changed += ran(name, REWRITES[name](work))
        work.dead_code()
        if idioms:
            changed += ran("sign idioms (" + ", ".join(idioms) + ")", sign_idioms(work, idioms))
        for name in ("clamp-sign", "reshape-transpose", "pad-transpose", "transpose-binarized",
                     "transpose-sink"):  # fmt: skip
            if name not in disabled:
                changed += ran(name, REWRITES[name](work))
        if not changed:
            break
    return work.build(keep_types=False), work.report


def check_valid(model: onnx.ModelProto, report: NormalizeReport) -> str | None:
    """None when `model` passes onnx.checker, ONNX Runtime loads it and every source the
    report names is a tensor of it; else the first line of what is wrong."""
    names = {i.name for i in model.graph.input} | {o for n in model.graph.node for o in n.output}
    missing = sorted(set(report.zero_sensitive) - names)
    if missing:
        return f"the zero-free check names tensor(s) the graph lacks: {', '.join(missing)}"
    try:
        if model.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF:
            onnx.checker.check_model(model)
        ort_session(model.SerializeToString())
    except Exception as error:
        return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return None


def _name_the_broken_pass(model, batch, disabled, max_rounds) -> None:
    """Run the passes again, checking after each one; InvalidModelError naming the first pass
    that turned a valid graph into an invalid one. None when no pass did: the input was not
    valid to begin with (a custom op whose pass is disabled), and the stage that meets what
    is left reports it."""
    state = {"valid": check_valid(model, NormalizeReport()) is None}

    def after(name: str, work: Work) -> None:
        found = check_valid(work.build(keep_types=False), work.report)
        if found is not None and state["valid"]:
            raise InvalidModelError(
                f"internal error: the normaliser's pass {name} produced an invalid ONNX graph "
                f"({found}); --disable-rewrite skips a pass"
            )
        state["valid"] = found is None

    _run(model, batch, disabled, max_rounds, after)


# the sign-function labels are passes too, so they can be listed and disabled by name
for _name in SIGN_IDIOMS:
    REWRITES[_name] = lambda work, _n=_name: sign_idioms(work, [_n])
