"""The graph the passes rewrite (`EditableGraph`), what `normalize` reports, and the small
edits every pass makes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

ONNX_DOMAINS = ("", "ai.onnx")
QONNX_DOMAINS = ("qonnx.custom_op.general", "finn.custom_op.general")


@dataclass
class NormalizeReport:
    """What `normalize` did: rewrites per pass name, and the canonical binarizations whose
    source maps 0 to something else than +1 in the original graph (source -> what 0 became)."""

    applied: dict[str, int] = field(default_factory=dict)
    zero_sensitive: dict[str, float] = field(default_factory=dict)
    batch: int | None = None  # the batch size fixed in place of a dynamic one


@dataclass(frozen=True)
class GraphView:
    """A read-only view of an `EditableGraph` in the shape `converters.patterns` reads
    (`ReadableGraph`, as `converters.graph.Graph` is one): the producer of each tensor, as of
    when the view was taken, and the constants. The editable graph keeps no producer map of
    its own because passes edit its node list in place."""

    producer: Mapping[str, onnx.NodeProto]
    constants: Mapping[str, np.ndarray]

    def const(self, name: str) -> np.ndarray | None:
        """The value of tensor `name` when it is a constant, else None."""
        return self.constants.get(name)


class EditableGraph:
    """The graph being normalised: nodes, constants by name, value types and shapes."""

    def __init__(
        self, model: onnx.ModelProto, batch: int = 1, sign_idioms: Iterable[str] = ()
    ) -> None:
        self.model = model
        # what the passes that take a setting read: the batch size `fix-batch` gives a dynamic
        # batch dimension, and the labels of the sign idioms the classifier may rewrite
        self.batch = batch
        self.sign_idioms = frozenset(sign_idioms)
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

    def add_const(self, value: np.ndarray, base: str) -> str:
        """A new constant holding `value`; its fresh name."""
        name = self.fresh(base)
        self.consts[name] = np.asarray(value)
        return name

    def view(self, producers: Mapping[str, onnx.NodeProto] | None = None) -> GraphView:
        """The graph as `converters.patterns` reads one (`ReadableGraph`), with `producers`
        when the caller has them at hand (the view does not see nodes added after it)."""
        return GraphView(self.producers() if producers is None else producers, self.consts)

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


def is_static(shape: list[int | None] | None) -> bool:
    return shape is not None and all(d is not None and d > 0 for d in shape)


def replace_node(graph: EditableGraph, old: onnx.NodeProto, new: list[onnx.NodeProto]) -> None:
    """Put `new` where `old` was (it produces the same output name)."""
    at = graph.nodes.index(old)
    graph.nodes[at : at + 1] = new


def scalar(graph: EditableGraph, name: str) -> float | None:
    value = graph.consts.get(name) if name else None
    if value is None or np.asarray(value).size != 1:
        return None
    return float(np.ravel(value)[0])
