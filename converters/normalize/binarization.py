"""The canonical binarization: recognising it, writing it, and following it to a layer."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from converters.normalize.editable_graph import EditableGraph

LAYERS = ("Conv", "MatMul", "Gemm")
# ops a ±1 tensor passes on its way to a layer (as in converters.patterns, plus Pad)
PASS_THROUGH = ("Identity", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool",
                "Pad")  # fmt: skip


def canonical_binarization(
    graph: EditableGraph, source: str, output: str, scale: float = 1.0
) -> list[onnx.NodeProto]:
    """`output` = Where(GreaterOrEqual(source, 0), 1, -1) (times `scale` when it is not 1)."""
    zero = graph.const(np.array(0.0, np.float32), "zero")
    one = graph.const(np.array(1.0, np.float32), "one")
    minus = graph.const(np.array(-1.0, np.float32), "minus_one")
    cond = graph.fresh(f"{source}__ge0")
    signed = output if scale == 1.0 else graph.fresh(f"{source}__sign")
    nodes = [
        helper.make_node("GreaterOrEqual", [source, zero], [cond], name=graph.fresh("binarize")),
        helper.make_node("Where", [cond, one, minus], [signed], name=graph.fresh("binarize")),
    ]
    if scale != 1.0:
        s = graph.const(np.array(scale, np.float32), "scale")
        nodes.append(helper.make_node("Mul", [signed, s], [output], name=graph.fresh("scale")))
    return nodes


def is_canonical(graph: EditableGraph, node: onnx.NodeProto, producers: dict) -> bool:
    """Already a form the translator binarizes (converters.patterns): leave it as it is."""
    if node.op_type == "Where":
        cond = producers.get(node.input[0])
        branches = [graph.consts.get(n) for n in node.input[1:]]
        return (
            cond is not None and cond.op_type == "GreaterOrEqual"
            and np.asarray(graph.consts.get(cond.input[1], 1)).size == 1
            and graph.consts.get(cond.input[1]) is not None
            and float(np.ravel(graph.consts[cond.input[1]])[0]) == 0.0
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


def feeds_layer(graph: EditableGraph, name: str, consumers: dict) -> bool:
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


def binarized_source(node: onnx.NodeProto, producers: dict) -> str:
    """x of a canonical binarization (`is_canonical`): Where(GreaterOrEqual(x, 0), 1, -1) or
    Sign(Add(Sign(x), c))."""
    inner = producers[node.input[0]]
    if node.op_type == "Where":
        return inner.input[0]
    sign = next(producers[n] for n in inner.input if n in producers and
                producers[n].op_type == "Sign")  # fmt: skip
    return sign.input[0]
