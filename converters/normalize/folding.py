"""Passes that make shapes static and fold what is constant.

- ``fix-batch``: a dynamic batch dimension becomes 1, so shape chains fold (another batch is
  fixed in the ONNX file before normalising, `converters.batch`, the one way to convert at N);
- ``drop-noise``: `Identity`, `CastLike` to a known type, no-op `Cast` and reshapes (and
  `Expand`s) to the shape a tensor already has removed (dynamo, bitorch's `view_as`, the legacy
  exporter's in-place slice updates);
- ``fold-constants``: every node whose inputs are all constant (weights binarized in forward,
  shape chains, Brevitas' clamp + sign) evaluated by ONNX Runtime (the reference evaluator for
  what it lacks), so a folded weight is what ONNX Runtime computes from the original: the one
  constant folder, `converters.graph.OnnxGraph.fold`, which readers run too
  (`OnnxGraph.folded`), here keeping layout ops on stored kernels as nodes.

When each runs: `converters.normalize.fixpoint.PIPELINE`.
"""

from __future__ import annotations

import onnx
from bnnexport.converters.errors import InvalidModelError
from bnnexport.converters.graph import ONNX_DOMAINS, OnnxGraph, is_static
from bnnexport.converters.normalize.registry import count_rewrites, rewrite
from bnnexport.converters.patterns import LAYER_OPS
from onnx import helper


@rewrite("fix-batch")
def fix_batch(graph: OnnxGraph) -> int:
    """A dynamic first dimension of each input becomes 1; other dynamic dims refuse. Only the
    first call changes anything."""
    changed = 0
    for info in graph.inputs:
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
            dim.dim_value = 1
            changed += 1
    count_rewrites(graph, "fix-batch", changed)
    return changed


@rewrite("drop-noise")
def drop_noise(graph: OnnxGraph) -> int:
    """Identity nodes, CastLike to a known type, Casts to the type a tensor already has and
    reshapes or expands to the shape it already has (bitorch's view_as; the legacy exporter's
    `Expand` of an in-place slice update)."""
    outputs = {o.name for o in graph.outputs}
    initializers = {i.name for i in graph.model.graph.initializer}
    changed = 0
    for node in list(graph.nodes):
        if node.op_type == "CastLike" and node.domain in ONNX_DOMAINS:
            to = graph.elem_type(node.input[1])
            if to:  # CastLike(x, like) is Cast(x, to=type of like)
                node.op_type = "Cast"
                graph.set_inputs(node, node.input[:1])
                del node.attribute[:]
                node.attribute.append(helper.make_attribute("to", to))
                changed += 1
        noop_cast = node.op_type == "Cast" and (
            graph.elem_type(node.input[0]) is not None
            and graph.elem_type(node.input[0]) == helper.get_attribute_value(node.attribute[0])
        )
        noop_reshape = node.op_type in (
            "Reshape",
            "Squeeze",
            "Unsqueeze",
            "Flatten",
            "Expand",
        ) and (
            is_static(graph.shape(node.input[0]))
            and graph.shape(node.input[0]) == graph.shape(node.output[0])
        )
        shared = node.op_type == "Identity" and node.input[0] in initializers
        removable = (node.op_type == "Identity" and not shared) or noop_cast or noop_reshape
        if removable and node.output[0] not in outputs:
            graph.remove(node)
            graph.rename_uses(node.output[0], node.input[0])
            changed += 1
    count_rewrites(graph, "drop-noise", changed)
    return changed


def _kernel_layout(graph: OnnxGraph, node: onnx.NodeProto, initializers: set[str]) -> bool:
    """A layout op on a stored weight that only layers read as their kernel (the legacy
    exporter's `Transpose(W)` before MatMul). Left in place: the translator reads through it,
    and the weight keeps its state-dict name, by which PyTorch's exact-grid twin loads it."""
    readers = graph.consumers.get(node.output[0], []) if node.output else []
    return (
        node.op_type in ("Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten")
        and node.input[0] in initializers
        and bool(readers)
        and all(
            r.op_type in LAYER_OPS and list(r.input).index(node.output[0]) == 1 for r in readers
        )
    )


@rewrite("fold-constants")
def fold_constants(graph: OnnxGraph) -> int:
    """Replace every node whose inputs are all constant by its value (and `Shape` of a tensor
    whose shape is static by that shape): `OnnxGraph.fold`, keeping layout ops on stored
    kernels (`_kernel_layout`) and `Identity(initializer)` (`_alias`) as nodes."""
    initializers = {i.name for i in graph.model.graph.initializer}

    def keep(node: onnx.NodeProto) -> bool:
        if node.op_type == "Identity" and node.input[0] in initializers:
            _alias(graph, node)
            return True
        return _kernel_layout(graph, node, initializers)

    changed = graph.fold(keep)
    count_rewrites(graph, "fold-constants", changed)
    return changed


def _alias(graph: OnnxGraph, node: onnx.NodeProto) -> None:
    """Identity(initializer): its output's value is known, but the node stays (see
    `OnnxGraph.aliases`)."""
    if node.output[0] not in graph.constants:
        graph.constants[node.output[0]] = graph.constants[node.input[0]]
        graph.aliases.add(node.output[0])
