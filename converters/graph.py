"""One ONNX graph model for reading and rewriting: `OnnxGraph`.

The normaliser's passes edit it (`converters.normalize`); the pattern finder, the translator,
the gate and the layer map read it. It holds the nodes, the constants by name (initializers,
Constant nodes and folded values), value types and shapes, inputs and outputs, and the
`producer` and `consumers` of every tensor. Those two maps are cached and dropped by every edit
of the nodes, which goes through a method (`remove`, `replace`, `set_input`, `rename_uses`, or
assigning `nodes`): `nodes` is a tuple, so an edit that bypasses them fails instead of leaving a
stale map (a stale producer map is a silent wrong rewrite). A reader of an ONNX file builds it
with `OnnxGraph.folded`, which evaluates every node whose inputs are all constant, so the
readers see real tensors where the exporter left constant subgraphs (docs/LCE_NOTES.md "PyTorch
to ONNX": `F.pad(x, value=1)` exports a Pad whose pads come from a Shape/ConstantOfShape/Concat/
Slice/Cast chain).

Example:
    >>> import onnx
    >>> from onnx import TensorProto, helper
    >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    >>> nodes = [helper.make_node("Constant", [], ["c"], value_float=2.0),
    ...          helper.make_node("Neg", ["c"], ["n"]),
    ...          helper.make_node("Relu", ["x"], ["r"]),
    ...          helper.make_node("Mul", ["r", "n"], ["y"])]
    >>> graph = OnnxGraph.folded(helper.make_model(helper.make_graph(nodes, "g", [x], [y])))
    >>> [n.op_type for n in graph.nodes], float(graph.const("n"))
    (['Relu', 'Mul'], -2.0)
    >>> [n.op_type for n in graph.match_parent_path(graph.producer["y"], ["Relu"], [0])]
    ['Relu']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from bnnexport.converters.errors import InvalidModelError
from bnnexport.converters.runtimes import ort_session
from onnx import helper, numpy_helper

ONNX_DOMAINS = ("", "ai.onnx")
QONNX_DOMAINS = ("qonnx.custom_op.general", "finn.custom_op.general")
# constants larger than this enter shape inference as typed inputs: it needs their shapes only
LARGE_CONSTANT = 4096
# what a reader folds (`OnnxGraph.folded`): the ops of the constant subgraphs exporters leave
# (shape chains, layouts of stored weights, constant masks and fills), by the same folder as
# the normaliser's `fold-constants`. Other computations on weights (XNOR-Net's ReduceMean of
# |w|) are that pass's to fold: with it disabled, the translator names them. A
# DequantizeLinear of a constant is an int8 model's kernel or bias (`converters.quantize`).
READER_FOLDS = (
    "Constant", "Shape", "Identity", "Cast", "ConstantOfShape", "Concat", "Reshape", "Transpose",
    "Slice", "Unsqueeze", "Squeeze", "Gather", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Sign",
    "Equal", "Less", "Greater", "GreaterOrEqual", "LessOrEqual", "Not", "Where", "Expand",
    "Range", "DequantizeLinear",
)  # fmt: skip
# ops whose value is not a function of their inputs: never folded
NEVER_FOLD = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
              "Multinomial", "Bernoulli")  # fmt: skip


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Load and check an ONNX file, raising `InvalidModelError` for anything unreadable."""
    path = Path(path)
    if not path.is_file():
        raise InvalidModelError(f"no such ONNX file: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as error:  # protobuf raises several types for truncated/foreign bytes
        raise InvalidModelError(f"{path} is not a readable ONNX model ({error})") from None
    if not model.graph.node:
        raise InvalidModelError(f"{path} is not an ONNX model (no graph nodes)")
    return model


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as plain Python values (strings decoded)."""
    out: dict[str, Any] = {}
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        out[attr.name] = value
    return out


def is_static(shape: Sequence[int | None] | None) -> bool:
    """A known shape with every dimension known and positive."""
    return shape is not None and all(d is not None and d > 0 for d in shape)


@dataclass
class NormalizeReport:
    """What `normalize` did: rewrites per pass name, and the canonical binarizations whose
    source maps 0 to something else than +1 in the original graph (source -> what 0 became)."""

    applied: dict[str, int] = field(default_factory=dict)
    zero_sensitive: dict[str, float] = field(default_factory=dict)


class OnnxGraph:
    """An ONNX graph to read and rewrite (module doc): nodes, constants, types, and cached
    producer/consumer maps that every edit drops.

    The normaliser's setting rides along for its passes: `sign_idioms` (the labels the sign
    classifier may rewrite); and `report`, what the passes did.
    """

    def __init__(self, model: onnx.ModelProto, sign_idioms: Iterable[str] = ()) -> None:
        self.model = model
        self.sign_idioms = frozenset(sign_idioms)
        graph = model.graph
        self.constants: dict[str, np.ndarray] = {
            i.name: numpy_helper.to_array(i) for i in graph.initializer
        }
        self.inputs = [i for i in graph.input if i.name not in self.constants]
        self.outputs = list(graph.output)
        self.types: dict[str, onnx.TypeProto] = {}
        # constants the graph held as Constant nodes stay Constant nodes (not initializers):
        # bnnexport's PyTorch twin loads every float initializer by its state-dict name
        self.constant_nodes: set[str] = set()
        # Identity(initializer) outputs: known values, but the node stays (it is how the
        # exporter shares one tensor between two parameters, which the twin splits again)
        self.aliases: set[str] = set()
        self.report = NormalizeReport()
        self._names = 0
        self._nodes: tuple[onnx.NodeProto, ...] = tuple(graph.node)
        self._producer: Mapping[str, onnx.NodeProto] | None = None
        self._consumers: Mapping[str, tuple[onnx.NodeProto, ...]] | None = None

    @classmethod
    def folded(cls, model: onnx.ModelProto) -> OnnxGraph:
        """`model` as a reader sees it: types inferred, and every node of a constant subgraph
        (`READER_FOLDS`: a Constant, `Shape` of a static shape, a shape chain, a layout op on
        a stored weight) folded into `constants` by `fold` and gone from `nodes`. `model`
        itself is left unchanged."""
        graph = cls(model)
        graph._infer_types(graph._assemble(for_inference=True))
        graph.fold(keep=lambda node: node.op_type not in READER_FOLDS)
        return graph

    # -- nodes, and the maps every edit drops --------------------------------------------

    @property
    def nodes(self) -> tuple[onnx.NodeProto, ...]:
        """The nodes in graph order (a tuple: edit through the methods below)."""
        return self._nodes

    @nodes.setter
    def nodes(self, nodes: Iterable[onnx.NodeProto]) -> None:
        self._nodes = tuple(nodes)
        self._changed()

    @property
    def producer(self) -> Mapping[str, onnx.NodeProto]:
        """The node computing each tensor, by name (read-only; rebuilt after an edit)."""
        if self._producer is None:
            self._producer, self._consumers = _maps(self._nodes)
        return self._producer

    @property
    def consumers(self) -> Mapping[str, tuple[onnx.NodeProto, ...]]:
        """The nodes reading each tensor, in graph order (read-only; rebuilt after an edit)."""
        if self._consumers is None:
            self._producer, self._consumers = _maps(self._nodes)
        return self._consumers

    def _changed(self) -> None:
        self._producer = self._consumers = None

    def _index(self, node: onnx.NodeProto) -> int:
        return next(k for k, n in enumerate(self._nodes) if n is node)

    def remove(self, node: onnx.NodeProto) -> None:
        """Drop `node` from the graph."""
        at = self._index(node)
        self.nodes = self._nodes[:at] + self._nodes[at + 1 :]

    def replace(self, old: onnx.NodeProto, new: Sequence[onnx.NodeProto]) -> None:
        """Put `new` where `old` was (they produce the same output names)."""
        at = self._index(old)
        self.nodes = (*self._nodes[:at], *new, *self._nodes[at + 1 :])

    def set_input(self, node: onnx.NodeProto, k: int, name: str) -> None:
        """`node` reads `name` as its input `k`."""
        node.input[k] = name
        self._changed()

    def set_inputs(self, node: onnx.NodeProto, names: Sequence[str]) -> None:
        """`node` reads `names` as its inputs."""
        node.input[:] = list(names)
        self._changed()

    def rename_uses(self, old: str, new: str) -> None:
        """Every reader of `old` reads `new` (graph outputs keep their names)."""
        for node in self.consumers.get(old, ()):
            node.input[:] = [new if v == old else v for v in node.input]
        self._changed()

    def match_parent_path(
        self,
        node: onnx.NodeProto,
        op_types: Sequence[str],
        indices: Sequence[int | None] | None = None,
    ) -> list[onnx.NodeProto] | None:
        """The chain of parents up from `node`, as ONNX Runtime's
        `OnnxModel.match_parent_path` gives it: the producer of `node`'s input `indices[0]`
        has op type `op_types[0]`, the producer of that one's input `indices[1]` has
        `op_types[1]`, and so on; an index of None takes the first input whose producer has
        the op type. None when the chain breaks anywhere.

        Example: `graph.match_parent_path(scatter, ["Transpose", "NonZero"], [1, 0])` is
        [Transpose, NonZero] when `scatter`'s indices are Transpose(NonZero(mask))."""
        found = []
        for op_type, k in zip(op_types, indices or [None] * len(op_types), strict=True):
            names = node.input if k is None else node.input[k : k + 1]
            parents = (self.producer.get(n) for n in names)
            node = next((p for p in parents if p is not None and p.op_type == op_type), None)
            if node is None:
                return None
            found.append(node)
        return found

    # -- values ---------------------------------------------------------------------------

    def const(self, name: str) -> np.ndarray | None:
        """The value of tensor `name` when it is a constant, else None."""
        return self.constants.get(name)

    def scalar(self, name: str) -> float | None:
        """The value of a one-element constant as a float, else None."""
        value = self.constants.get(name) if name else None
        if value is None or np.asarray(value).size != 1:
            return None
        return float(np.ravel(value)[0])

    def shape(self, name: str) -> list[int | None] | None:
        """The shape of tensor `name` (None for an unknown dimension), or None."""
        if name in self.constants:
            return list(self.constants[name].shape)
        found = self.types.get(name)
        if found is None or not found.tensor_type.HasField("shape"):
            return None
        dims = found.tensor_type.shape.dim
        return [d.dim_value if d.HasField("dim_value") else None for d in dims]

    def elem_type(self, name: str) -> int | None:
        """The ONNX element type of tensor `name`, or None."""
        if name in self.constants:
            return helper.np_dtype_to_tensor_dtype(self.constants[name].dtype)
        found = self.types.get(name)
        return found.tensor_type.elem_type if found is not None else None

    def fresh(self, base: str) -> str:
        """A tensor or node name no other has."""
        self._names += 1
        return f"{base}__n{self._names}"

    def add_const(self, value: np.ndarray, base: str) -> str:
        """A new constant holding `value`; its fresh name."""
        name = self.fresh(base)
        self.constants[name] = np.asarray(value)
        return name

    # -- the graph as a model, shapes, dead code ------------------------------------------

    def build(self, keep_types: bool = False) -> onnx.ModelProto:
        """The current graph as a model, dead nodes and unused constants left out."""
        self.dead_code()
        return self._assemble(keep_types)

    def _assemble(self, keep_types: bool = False, for_inference: bool = False) -> onnx.ModelProto:
        """The model; `for_inference`: large initializers as typed inputs (`_infer_types`),
        never serialized (a copy of every weight, per inference, on a model of 100 MB)."""
        used = {n for node in self._nodes for n in node.input} | {o.name for o in self.outputs}
        stored = [
            (k, v)
            for k, v in self.constants.items()
            if k in used and k not in self.constant_nodes and k not in self.aliases
        ]
        typed = []
        if for_inference:
            typed = [(k, v) for k, v in stored if v.size > LARGE_CONSTANT]
            stored = [(k, v) for k, v in stored if v.size <= LARGE_CONSTANT]
        inits = [numpy_helper.from_array(v, k) for k, v in stored]
        nodes = [
            helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v, k))
            for k, v in self.constants.items()
            if k in used and k in self.constant_nodes
        ] + list(self._nodes)
        # a graph output that became a constant is produced by a Constant node
        for out in self.outputs:
            if out.name in self.constants and not any(out.name in n.output for n in nodes):
                value = numpy_helper.from_array(self.constants[out.name], out.name)
                nodes.append(helper.make_node("Constant", [], [out.name], value=value))
                inits = [i for i in inits if i.name != out.name]
        infos = [helper.make_value_info(k, v) for k, v in self.types.items()] if keep_types else []
        inputs = list(self.inputs) + [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in typed
        ]
        graph = helper.make_graph(nodes, self.model.graph.name or "graph", inputs,
                                  self.outputs, inits, value_info=infos)  # fmt: skip
        model = helper.make_model(graph, opset_imports=list(self.model.opset_import))
        model.ir_version = self.model.ir_version
        return model

    def infer(self) -> None:
        """Refresh value types and shapes with ONNX shape inference (a help, never required)."""
        self.dead_code()
        self._infer_types(self._assemble(for_inference=True))

    def _infer_types(self, model: onnx.ModelProto) -> None:
        """Types and shapes of `model` (one built here, changed in place) into `types`."""
        # large constants (weights) enter as typed inputs: inference needs their shapes, not
        # their values, and the normaliser builds the model again every round
        graph = model.graph
        large = [i for i in graph.initializer if np.prod(i.dims) > LARGE_CONSTANT]
        kept = [i for i in graph.initializer if np.prod(i.dims) <= LARGE_CONSTANT]
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
        for node in reversed(self._nodes):
            if any(o in needed for o in node.output):
                kept.append(node)
                needed.update(n for n in node.input if n)
        if len(kept) != len(self._nodes):
            self.nodes = kept[::-1]

    # -- folding: the one constant folder ------------------------------------------------

    def fold(self, keep: Callable[[onnx.NodeProto], bool] = lambda node: False) -> int:
        """Replace every node whose outputs are constant (`folded_values`) by their values,
        in graph order (so chains fold in one call), except the nodes `keep` holds; how many
        were folded. A Constant node's outputs stay Constant nodes when the graph is built."""
        kept, folded = [], 0
        for node in self._nodes:
            values = None if keep(node) else self.folded_values(node)
            if values is None:
                kept.append(node)
                continue
            outputs = [o for o in node.output if o]
            self.constants.update(zip(outputs, map(np.asarray, values), strict=False))
            if node.op_type == "Constant":
                self.constant_nodes.update(outputs)
            folded += 1
        if folded:
            self.nodes = kept
        return folded

    def folded_values(self, node: onnx.NodeProto) -> list[np.ndarray] | None:
        """The values of `node`'s outputs when they are constant: `Shape` of a static shape,
        a `Constant`, or a node of the ONNX domain whose inputs are all constant, evaluated by
        ONNX Runtime (`evaluate`); None otherwise, or when it cannot be evaluated (the
        translator names what it cannot convert)."""
        if node.domain not in ONNX_DOMAINS or node.op_type in NEVER_FOLD:
            return None
        if node.op_type == "Shape":
            return self._static_shape_of(node)
        if node.op_type != "Constant" and not (
            node.input and all(not n or n in self.constants for n in node.input)
        ):
            return None
        try:
            return self.evaluate(node, {n: self.constants[n] for n in node.input if n})
        except Exception:
            return None

    def evaluate(self, node: onnx.NodeProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run one node on constant inputs with ONNX Runtime (the reference the gate compares
        with, so a folded weight is bit for bit what ONNX Runtime computes from the original
        graph); ONNX's reference evaluator for what ONNX Runtime does not run."""
        make_info = helper.make_tensor_value_info
        inputs = [
            make_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
            for k, v in feeds.items()
        ]
        outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        one_node = helper.make_graph([node], "fold", inputs, outputs)
        model = helper.make_model(one_node, opset_imports=list(self.model.opset_import))
        model.ir_version = self.model.ir_version
        try:
            return ort_session(model.SerializeToString(), optimize=False).run(None, dict(feeds))
        except Exception:  # an op or type ONNX Runtime lacks: the reference evaluator
            from onnx.reference import ReferenceEvaluator

            return ReferenceEvaluator(model).run(None, dict(feeds))

    def _static_shape_of(self, node: onnx.NodeProto) -> list[np.ndarray] | None:
        """[the value of `Shape(x)`] (its `start`/`end` slice) when x's shape is static."""
        shape = self.shape(node.input[0])
        if not is_static(shape):
            return None
        start = next((a.i for a in node.attribute if a.name == "start"), 0)
        end = next((a.i for a in node.attribute if a.name == "end"), len(shape))
        return [np.asarray(shape[start:end], np.int64)]


def _maps(
    nodes: Iterable[onnx.NodeProto],
) -> tuple[Mapping[str, onnx.NodeProto], Mapping[str, tuple[onnx.NodeProto, ...]]]:
    """(producer, consumers) of `nodes`, read-only."""
    producer: dict[str, onnx.NodeProto] = {}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.output:
            if name:
                producer[name] = node
        for name in node.input:
            if name:
                consumers.setdefault(name, []).append(node)
    readers = {name: tuple(found) for name, found in consumers.items()}
    return MappingProxyType(producer), MappingProxyType(readers)
