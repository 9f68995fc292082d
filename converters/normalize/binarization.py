"""The canonical binarization: recognising it, writing it, and following it to a layer."""

from __future__ import annotations

import numpy as np
import onnx
from bnnexport.converters.graph import OnnxGraph
from bnnexport.converters.patterns import LAYER_OPS, TO_LAYER, Binarization, match_binarization
from onnx import helper


def canonical_binarization(
    graph: OnnxGraph, source: str, output: str, scale: float = 1.0
) -> list[onnx.NodeProto]:
    """`output` = Where(GreaterOrEqual(source, 0), 1, -1) (times `scale` when it is not 1)."""
    zero = graph.add_const(np.array(0.0, np.float32), "zero")
    one = graph.add_const(np.array(1.0, np.float32), "one")
    minus = graph.add_const(np.array(-1.0, np.float32), "minus_one")
    cond = graph.fresh(f"{source}__ge0")
    signed = output if scale == 1.0 else graph.fresh(f"{source}__sign")
    nodes = [
        helper.make_node("GreaterOrEqual", [source, zero], [cond], name=graph.fresh("binarize")),
        helper.make_node("Where", [cond, one, minus], [signed], name=graph.fresh("binarize")),
    ]
    if scale != 1.0:
        s = graph.add_const(np.array(scale, np.float32), "scale")
        nodes.append(helper.make_node("Mul", [signed, s], [output], name=graph.fresh("scale")))
    return nodes


def binarization_at(graph: OnnxGraph, node: onnx.NodeProto) -> Binarization | None:
    """The binarization `node` ends, in a form the translator binarizes
    (`converters.patterns.match_binarization`), or None."""
    if not node.output or not node.output[0]:
        return None
    return match_binarization(graph, node.output[0])


def is_canonical(graph: OnnxGraph, node: onnx.NodeProto) -> bool:
    """Already a form the translator binarizes: leave it as it is."""
    return binarization_at(graph, node) is not None


def feeds_layer(graph: OnnxGraph, name: str) -> bool:
    """Does tensor `name` reach a Conv/MatMul/Gemm data input through ops that keep it ±1?"""
    stack, seen = [name], set()
    while stack:
        current = stack.pop()
        for reader in graph.consumers.get(current, []):
            if reader.op_type in LAYER_OPS and reader.input[0] == current:
                return True
            if reader.op_type in TO_LAYER and reader.input[0] == current:
                if reader.output[0] not in seen:
                    seen.add(reader.output[0])
                    stack.append(reader.output[0])
    return False


def binarized_source(graph: OnnxGraph, node: onnx.NodeProto) -> str:
    """x of the binarization `node` ends (`is_canonical` must hold)."""
    found = binarization_at(graph, node)
    if found is None:
        raise ValueError(f"{node.name or node.output[0]} is not a canonical binarization")
    return found.source
