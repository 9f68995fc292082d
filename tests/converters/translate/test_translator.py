"""The translator itself: graph depth, and errors that name the first unsupported node (in graph
order), its PyTorch module, the spelling that converts, and the supported ops."""

from __future__ import annotations

import io
import sys

import numpy as np
import onnx
import pytest
import torch
from bnnexport.converters.errors import UnsupportedOpError
from bnnexport.converters.translate import SUPPORTED
from bnnexport.converters.translate.onnx_to_tf import build_module
from onnx import TensorProto, helper


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


def test_the_first_unsupported_node_in_graph_order_is_named_before_tensorflow_runs(monkeypatch):
    """The translator walks back from the outputs and would meet the last Abs first; the scan
    before tracing names the first (a graph no torch exporter named: no PyTorch module)."""
    import bnnexport.converters.translate.onnx_to_tf as onnx_to_tf

    monkeypatch.setattr(onnx_to_tf, "tf", lambda: pytest.fail("TensorFlow was reached"))
    with pytest.raises(UnsupportedOpError) as caught:
        build_module(_chain(["Relu", "Abs", "Relu", "Abs", "Erf"]))
    message = str(caught.value)
    assert "'n1' of op type Abs" in message and "from PyTorch" not in message
    assert "instead, write it as torch.relu(x) + torch.relu(-x)" in message


class _Blocks(torch.nn.Module):
    """blocks.0 writes every other channel in place (a ScatterND no slice can express), then
    blocks.1 takes an Abs: two unsupported nodes, the scatter first."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(_EveryOther(), _Abs())

    def forward(self, x):
        return self.blocks(x)


class _EveryOther(torch.nn.Module):
    def forward(self, x):
        x = x * 2.0
        x[:, ::2] += 1.0
        return x


class _Abs(torch.nn.Module):
    def forward(self, x):
        return torch.abs(x)


@pytest.mark.parametrize("exporter", ["legacy", pytest.param("dynamo", marks=pytest.mark.slow)])
def test_an_unsupported_node_is_named_with_its_module_and_the_spelling_that_converts(exporter):
    from bnnexport.converters.graph import OnnxGraph
    from bnnexport.converters.normalize import normalize
    from bnnexport.converters.translate import first_unsupported

    x = torch.randn(1, 4, 3, 3)
    if exporter == "dynamo":
        model = torch.onnx.export(_Blocks(), (x,), dynamo=True).model_proto
    else:
        buffer = io.BytesIO()
        torch.onnx.export(_Blocks(), x, buffer, dynamo=False)
        model = onnx.load_from_string(buffer.getvalue())
    error = first_unsupported(OnnxGraph.folded(normalize(model)[0]))
    message = str(error)
    assert error.op_type == "ScatterND" and "from PyTorch module 'blocks.0'" in message
    assert "instead, write the in-place update as a concat of slices" in message
    assert "x = torch.cat([x[:, :a], x[:, a:b] + y, x[:, b:]], dim=1)" in message
