"""The translator itself: graph depth, and errors that name the node and the supported ops."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from converters.errors import UnsupportedOpError
from converters.translate.onnx_to_tf import SUPPORTED, build_module


def _chain(op_types: list[str]) -> onnx.ModelProto:
    nodes = [
        helper.make_node(op, [f"t{k}"], [f"t{k + 1}"], name=f"n{k}")
        for k, op in enumerate(op_types)
    ]
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(f"t{len(nodes)}", TensorProto.FLOAT, [1, 4])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.slow
def test_a_graph_deeper_than_the_recursion_limit_translates(monkeypatch):
    """Translation walks the graph iteratively: a chain of 2,500 nodes under a recursion limit
    of 1,000 that nothing may raise (the recursive translator needed one frame per node)."""
    monkeypatch.setattr(sys, "setrecursionlimit", lambda limit: None)
    depth = 2_501
    module, _ = build_module(_chain(["Neg"] * depth))
    x = np.array([[-2.0, -1.0, 1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(module.concrete(x)["output_0"].numpy(), -x)


def test_an_unsupported_node_is_named_with_the_supported_op_types():
    with pytest.raises(UnsupportedOpError) as caught:
        build_module(_chain(["Relu", "Erf", "Relu"]))
    message = str(caught.value)
    assert "'n1' of op type Erf" in message
    assert message.endswith(", ".join(SUPPORTED))


def test_a_handler_refusal_is_named_with_its_reason_and_the_supported_op_types():
    """A supported op with an attribute it cannot take (Cast to int32): the handler's reason,
    and the list added once by the translator."""
    model = _chain(["Relu", "Cast"])
    model.graph.node[1].attribute.append(helper.make_attribute("to", TensorProto.INT32))
    with pytest.raises(UnsupportedOpError) as caught:
        build_module(model)
    assert "(only casts to float32)" in str(caught.value)
    assert str(caught.value).endswith(", ".join(SUPPORTED))
