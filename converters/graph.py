"""One ONNX graph model for reading and rewriting: `OnnxGraph`.

The normaliser's passes edit it (`converters.normalize`); the pattern finder, the translator,
the gate and the layer map read it. It holds the nodes, the constants by name (initializers,
Constant nodes and folded values), value types and shapes, inputs, outputs and opsets, and the
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
from onnx import helper, numpy_helper

from converters.errors import InvalidModelError

ONNX_DOMAINS = ("", "ai.onnx")
QONNX_DOMAINS = ("qonnx.custom_op.general", "finn.custom_op.general")
# constants larger than this enter shape inference as typed inputs: it needs their shapes only
LARGE_CONSTANT = 4096


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
    batch: int | None = None  # the batch size fixed in place of a dynamic one


class OnnxGraph:
    """An ONNX graph to read and rewrite (module doc): nodes, constants, types, and cached
    producer/consumer maps that every edit drops.

    The normaliser's settings ride along for its passes: `batch` (what `fix-batch` gives a
    dynamic batch dimension), `sign_idioms` (the labels the sign classifier may rewrite), and
    `report`, what the passes did.
    """

    def __init__(
        self, model: onnx.ModelProto, batch: int = 1, sign_idioms: Iterable[str] = ()
    ) -> None:
        self.model = model
        self.batch = batch
        self.sign_idioms = frozenset(sign_idioms)
        graph = model.graph
        self.opsets = {o.domain: o.version for o in model.opset_import}
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
        """`model` as a reader sees it: types inferred, and every node whose inputs are all
        constant (a Constant, `Shape` of a static shape, a constant subgraph) folded into
        `constants` and gone from `nodes`. `model` itself is left unchanged."""
        graph = cls(model)
        graph._infer_types(graph._assemble())
        graph._fold_all()
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

    def _assemble(self, keep_types: bool = False) -> onnx.ModelProto:
        used = {n for node in self._nodes for n in node.input} | {o.name for o in self.outputs}
        inits = [
            numpy_helper.from_array(v, k)
            for k, v in self.constants.items()
            if k in used and k not in self.constant_nodes and k not in self.aliases
        ]
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
        graph = helper.make_graph(nodes, self.model.graph.name or "graph", self.inputs,
                                  self.outputs, inits, value_info=infos)  # fmt: skip
        model = helper.make_model(graph, opset_imports=list(self.model.opset_import))
        model.ir_version = self.model.ir_version
        return model

    def infer(self) -> None:
        """Refresh value types and shapes with ONNX shape inference (a help, never required)."""
        self._infer_types(self.build())

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

    # -- folding (a reader's graph) -------------------------------------------------------

    def _fold_all(self) -> None:
        kept = []
        for node in self._nodes:
            value = self._numpy_value(node)
            if value is None:
                kept.append(node)
            else:
                self.constants[node.output[0]] = value
        self.nodes = kept

    def _numpy_value(self, node: onnx.NodeProto) -> np.ndarray | None:
        if node.op_type == "Constant":
            return np.asarray(next(iter(attributes(node).values())))
        if node.op_type == "Shape":
            shape = self.shape(node.input[0])
            if shape is not None and all(d is not None for d in shape):
                return np.asarray(shape, dtype=np.int64)
        folder = _FOLDERS.get(node.op_type)
        inputs = [name for name in node.input if name]
        if folder is None or not inputs or not all(name in self.constants for name in inputs):
            return None
        try:
            return np.asarray(folder([self.constants[n] for n in inputs], attributes(node)))
        except Exception:  # leave it for the translator to report
            return None


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


def _slice(data, starts, ends, axes=None, steps=None):
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        index[int(axis)] = slice(int(start), int(end), int(step))
    return data[tuple(index)]


def _unsqueeze(data, axes):
    out = data
    for axis in sorted(int(a) % (data.ndim + len(axes)) for a in axes):
        out = np.expand_dims(out, axis)
    return out


# numpy evaluation of the ops that appear in constant subgraphs; (inputs, attrs) -> outputs
_FOLDERS: dict[str, Callable[[list, dict], np.ndarray]] = {
    "Identity": lambda i, a: i[0],
    "Cast": lambda i, a: i[0].astype(onnx.helper.tensor_dtype_to_np_dtype(a["to"])),
    "ConstantOfShape": lambda i, a: np.full(
        [int(d) for d in i[0]],
        a["value"].reshape(-1)[0] if "value" in a else np.float32(0),
    ),
    "Concat": lambda i, a: np.concatenate(i, axis=a["axis"]),
    "Reshape": lambda i, a: i[0].reshape(
        [int(d) if d != 0 else i[0].shape[k] for k, d in enumerate(i[1])]
    ),
    "Transpose": lambda i, a: np.transpose(i[0], a.get("perm")),
    "Slice": lambda i, a: _slice(i[0], *i[1:]),
    "Unsqueeze": lambda i, a: _unsqueeze(i[0], i[1] if len(i) > 1 else a["axes"]),
    "Squeeze": lambda i, a: np.squeeze(
        i[0], tuple(int(x) for x in (i[1] if len(i) > 1 else a["axes"]))
    ),
    "Gather": lambda i, a: np.take(i[0], i[1], axis=a.get("axis", 0)),
    "Add": lambda i, a: i[0] + i[1],
    "Sub": lambda i, a: i[0] - i[1],
    "Mul": lambda i, a: i[0] * i[1],
    "Div": lambda i, a: (i[0] // i[1]) if i[0].dtype.kind in "iu" else i[0] / i[1],
    "Neg": lambda i, a: -i[0],
    "Abs": lambda i, a: np.abs(i[0]),
    "Sign": lambda i, a: np.sign(i[0]),
    "Equal": lambda i, a: i[0] == i[1],
    "Less": lambda i, a: i[0] < i[1],
    "Greater": lambda i, a: i[0] > i[1],
    "GreaterOrEqual": lambda i, a: i[0] >= i[1],
    "LessOrEqual": lambda i, a: i[0] <= i[1],
    "Not": lambda i, a: np.logical_not(i[0]),
    "Where": lambda i, a: np.where(i[0], i[1], i[2]),
    "Expand": lambda i, a: i[0] * np.ones([int(d) for d in i[1]], dtype=i[0].dtype),
    "Range": lambda i, a: np.arange(i[0], i[1], i[2]).astype(i[0].dtype),
}
