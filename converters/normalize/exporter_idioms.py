"""Passes for what one exporter writes its own way.

- ``qonnx-bipolar``: QONNX `BipolarQuant(x, s)` -> the canonical binarization times `s`
  (`runnable_reference` writes the same out for ONNX Runtime to run the original);
- ``index-put``: dynamo's `out[mask] = c` (ScatterND at NonZero(mask)) -> Where(mask, c, out);
- ``ste-detach``: the straight-through trick `Add(Sub(S, P), P)` -> `S` (P's subgraph dies);
- ``keras-prelu``: `Add(Relu(x), Mul(Relu(Neg(x)), c))`, Keras' PReLU as tf2onnx writes it,
  becomes `PRelu(x, -c)`, which the translator emits in the one form TFLite fuses into a single
  PRELU op (docs/LCE_NOTES.md, "When TFLite's converter fuses a PReLU").

When each runs: `converters.normalize.fixpoint.PIPELINE`.
"""

from __future__ import annotations

import numpy as np
import onnx
from bnnexport.converters.graph import QONNX_DOMAINS, OnnxGraph
from bnnexport.converters.normalize.binarization import canonical_binarization
from bnnexport.converters.normalize.registry import count_rewrites, rewrite
from onnx import helper


@rewrite("qonnx-bipolar")
def qonnx_bipolar(graph: OnnxGraph) -> int:
    """QONNX BipolarQuant(x, scale): +1 where x >= 0, else -1, times scale (a scalar)."""
    changed = 0
    for node in list(graph.nodes):
        if node.op_type != "BipolarQuant" or node.domain not in QONNX_DOMAINS:
            continue
        scale = graph.constants.get(node.input[1]) if len(node.input) > 1 else np.float32(1.0)
        if scale is None or np.asarray(scale).size != 1 or not float(np.ravel(scale)[0]) > 0:
            continue  # a per-channel or computed scale: left for the translator to refuse
        graph.replace(node, canonical_binarization(graph, node.input[0], node.output[0],
                                        float(np.ravel(scale)[0])))  # fmt: skip
        changed += 1
    count_rewrites(graph, "qonnx-bipolar", changed)
    return changed


@rewrite("index-put")
def index_put(graph: OnnxGraph) -> int:
    """`out[mask] = c` as the dynamo exporter writes it, ScatterND(data,
    Transpose(NonZero(mask)), Reshape(Expand(c, count))), is Where(mask, c, data) when c is
    one constant value and the mask covers all of data's dimensions."""
    changed = 0
    for node in list(graph.nodes):
        if node.op_type != "ScatterND" or any(a.s not in (b"", b"none") for a in node.attribute):
            continue
        data, indices, updates = node.input[:3]
        path = graph.match_parent_path(node, ["Transpose", "NonZero"], [1, 0])
        if path is None:
            continue
        transpose, nonzero = path
        if [list(a.ints) for a in transpose.attribute if a.name == "perm"] != [[1, 0]]:
            continue
        mask = nonzero.input[0]
        value = _uniform_update(graph, updates)
        if value is None or graph.shape(mask) is None or graph.shape(mask) != graph.shape(data):
            continue
        dtype = helper.tensor_dtype_to_np_dtype(graph.elem_type(data) or onnx.TensorProto.FLOAT)
        c = graph.add_const(np.asarray(value, dtype), "put_value")
        graph.replace(node, [helper.make_node("Where", [mask, c, data], [node.output[0]],
                                               name=graph.fresh("index_put"))])  # fmt: skip
        changed += 1
    count_rewrites(graph, "index-put", changed)
    return changed


def _uniform_update(graph: OnnxGraph, name: str) -> np.ndarray | None:
    """The one value of an update tensor built as Reshape/Expand of a uniform constant."""
    for _ in range(4):
        if name in graph.constants:
            value = np.asarray(graph.constants[name])
            if value.size and np.all(value == value.reshape(-1)[0]):
                return value.reshape(-1)[0]
            return None
        node = graph.producer.get(name)
        if node is None or node.op_type not in ("Reshape", "Expand", "Identity"):
            return None
        name = node.input[0]
    return None


@rewrite("ste-detach")
def ste_detach(graph: OnnxGraph) -> int:
    """`s.detach() - p.detach() + p` (ReActNet, Bi-Real, IR-Net code) exports as
    Add(Sub(S, P), P): its forward value is S (up to the rounding of (S - P) + P, which is what
    the trick means), so readers of the Add read S and P's subgraph dies."""
    changed = 0
    for node in list(graph.nodes):
        if node.op_type != "Add" or any(n in graph.constants for n in node.input):
            continue
        for k in (0, 1):
            path = graph.match_parent_path(node, ["Sub"], [k])
            if path is None or path[0].input[1] != node.input[1 - k]:
                continue
            if node.output[0] not in {o.name for o in graph.outputs}:
                graph.remove(node)
                graph.rename_uses(node.output[0], path[0].input[0])
                changed += 1
            break
    count_rewrites(graph, "ste-detach", changed)
    return changed


@rewrite("keras-prelu")
def keras_prelu(graph: OnnxGraph) -> int:
    """Add(Relu(x), Mul(Relu(Neg(x)), c)) -> PRelu(x, -c), c a constant (either operand order).

    Equal for every non-NaN x: for x < 0 the sum is 0 + (-x) * c = x * (-c) (negation is
    exact), for x >= 0 it is x + 0 * c = x. Only the sign of a zero result may differ, and the
    original leaves that to how a runtime's Relu treats -0.0.
    """
    changed = 0
    for node in list(graph.nodes):
        match = _keras_prelu_match(graph, node) if node.op_type == "Add" else None
        if match is None:
            continue
        x, c = match
        slope = graph.add_const(np.negative(c).astype(np.float32), "prelu_slope")
        prelu = helper.make_node("PRelu", [x, slope], [node.output[0]], name=graph.fresh("prelu"))
        graph.replace(node, [prelu])
        changed += 1
    count_rewrites(graph, "keras-prelu", changed)
    return changed


def _keras_prelu_match(graph: OnnxGraph, add: onnx.NodeProto) -> tuple[str, np.ndarray] | None:
    """(x, c) when `add` is Add(Relu(x), Mul(Relu(Neg(x)), c)) in any operand order."""
    for k, j in ((k, j) for k in (0, 1) for j in (0, 1)):
        relu = graph.match_parent_path(add, ["Relu"], [k])
        path = graph.match_parent_path(add, ["Mul", "Relu", "Neg"], [1 - k, j, 0])
        if relu is None or path is None:
            continue
        mul, _, neg = path
        c = graph.constants.get(mul.input[1 - j])
        if c is not None and c.dtype == np.float32 and neg.input[0] == relu[0].input[0]:
            return relu[0].input[0], c
    return None


def runnable_reference(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model ONNX Runtime runs as the reference: None when it runs the original as it is;
    for QONNX models, the original with each BipolarQuant written out in standard ONNX ops by
    its definition (`qonnx_bipolar`), nothing else changed."""
    if not any(n.domain in QONNX_DOMAINS for n in model.graph.node):
        return None
    graph = OnnxGraph(onnx.ModelProto.FromString(model.SerializeToString()))
    qonnx_bipolar(graph)
    built = graph.build()
    del built.opset_import[:]
    built.opset_import.extend(o for o in model.opset_import if o.domain not in QONNX_DOMAINS)
    return built
