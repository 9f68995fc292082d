"""The one ONNX graph model (`converters.graph.OnnxGraph`): its cached producer and consumer
maps stay equal to a fresh computation through every edit the normaliser's passes make."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from bnnexport.converters.graph import OnnxGraph
from bnnexport.converters.normalize import PIPELINE, SIGN_IDIOMS, normalize
from bnnexport.converters.normalize.registry import registered
from onnx import TensorProto, helper
from support.client_nets import ROWS, export_onnx

# one row per pass family a client's export exercises (the legacy exporter where it suffices:
# it is the faster one)
GUARDED = [
    ("bitorch", "lenet", "legacy"),
    ("brevitas", "binary-cnn", "qonnx"),
    ("brevitas", "binary-cnn", "dynamo"),
    ("plain-torch", "reactnet", "legacy"),
    ("plain-torch", "xnornet", "legacy"),
    ("plain-torch", "irnet", "dynamo"),
    ("plain-torch", "index-put", "dynamo"),
    ("plain-torch", "index-new-linear", "legacy"),
    ("plain-torch", "binarynet-classic", "legacy"),
]


def _fresh_maps(graph: OnnxGraph) -> tuple[dict, dict]:
    """(producer, consumers) computed from the nodes now, as node ids."""
    producer, consumers = {}, {}
    for node in graph.nodes:
        producer.update({name: id(node) for name in node.output if name})
        for name in node.input:
            if name:
                consumers.setdefault(name, []).append(id(node))
    return producer, consumers


def _cached_maps(graph: OnnxGraph) -> tuple[dict, dict]:
    producer = {name: id(node) for name, node in graph.producer.items()}
    consumers = {name: [id(n) for n in found] for name, found in graph.consumers.items()}
    return producer, consumers


def _run_checked(model: onnx.ModelProto) -> OnnxGraph:
    """`normalize`'s rounds, step by step, the maps read before every step (so an edit that
    forgot to drop them leaves them stale) and compared with fresh ones after it."""
    graph = OnnxGraph(onnx.ModelProto.FromString(model.SerializeToString()),
                      sign_idioms=SIGN_IDIOMS)  # fmt: skip
    for _ in range(64):
        changed = 0
        for name in PIPELINE:
            _cached_maps(graph)
            changed += registered(name)(graph)
            assert _cached_maps(graph) == _fresh_maps(graph), f"stale maps after {name}"
        if not changed:
            return graph
    raise AssertionError("the pipeline did not settle")


def _row(client: str, name: str, exporter: str):
    return next(r for r in ROWS if (r.client, r.model, r.exporter) == (client, name, exporter))


@pytest.mark.parametrize("key", GUARDED, ids=["-".join(k) for k in GUARDED])
def test_the_cached_maps_match_the_nodes_after_every_pass(key, tmp_path):
    row = _row(*key)
    net, shape = row.build()
    model = onnx.load(str(export_onnx(net, shape, tmp_path / "model.onnx", row.exporter)))
    graph = _run_checked(model)
    assert graph.report.applied.get(row.key_pass, 0) > 0
    # the loop above is the pipeline: the same graph as `normalize` gives
    normalized, _ = normalize(model)
    assert graph.build().SerializeToString() == normalized.SerializeToString()


def test_the_cached_maps_match_the_nodes_on_a_tf2onnx_graph():
    from support.tf2onnx_nets import larq_like

    model, _ = larq_like()
    graph = _run_checked(model)
    assert {"transpose-binarized", "transpose-sink"} <= set(graph.report.applied)


def _chain() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Neg", ["r"], ["n"], name="neg"),
        helper.make_node("Add", ["n", "r"], ["y"], name="add"),
    ]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]))


def test_every_edit_drops_the_maps():
    graph = OnnxGraph(_chain())
    relu, neg, add = graph.nodes
    assert [n.name for n in graph.consumers["r"]] == ["neg", "add"]
    graph.rename_uses("n", "r")
    assert [n.name for n in graph.consumers["r"]] == ["neg", "add", "add"]
    graph.set_input(add, 0, "x")
    assert "n" not in graph.consumers and [n.name for n in graph.consumers["x"]] == ["relu", "add"]
    graph.remove(neg)
    assert "n" not in graph.producer
    abs_ = helper.make_node("Abs", ["x"], ["r"], name="abs")
    graph.replace(relu, [abs_])
    assert graph.producer["r"] is abs_ and graph.nodes == (abs_, add)


def test_the_nodes_and_maps_cannot_be_edited_behind_the_graphs_back():
    graph = OnnxGraph(_chain())
    with pytest.raises(AttributeError):
        graph.nodes.remove(graph.nodes[0])  # a tuple: edits go through the methods
    with pytest.raises(TypeError):
        graph.producer["z"] = graph.nodes[0]


def test_a_reader_sees_constant_subgraphs_folded():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Constant", [], ["axes"], value_ints=[0]),
        helper.make_node("Gather", ["shape", "axes"], ["batch"]),
        helper.make_node("Constant", [], ["rest"], value_ints=[-1]),
        helper.make_node("Concat", ["batch", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    graph = OnnxGraph.folded(helper.make_model(helper.make_graph(nodes, "g", [x], [y])))
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    np.testing.assert_array_equal(graph.const("target"), [1, -1])


def _diamond() -> OnnxGraph:
    """y = Add(Neg(Relu(x)), Abs(x)), and Sub(y, x) reading y first."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Neg", ["r"], ["n"], name="neg"),
        helper.make_node("Abs", ["x"], ["a"], name="abs"),
        helper.make_node("Add", ["n", "a"], ["y"], name="add"),
        helper.make_node("Sub", ["y", "x"], ["z"], name="sub"),
    ]
    return OnnxGraph(helper.make_model(helper.make_graph(nodes, "g", [x], [z])))


def _names(path):
    return None if path is None else [n.name for n in path]


def test_match_parent_path_follows_the_given_inputs():
    graph = _diamond()
    sub = graph.producer["z"]
    assert _names(graph.match_parent_path(sub, ["Add", "Neg", "Relu"], [0, 0, 0])) == [
        "add",
        "neg",
        "relu",
    ]
    assert _names(graph.match_parent_path(sub, ["Add", "Abs"], [0, 1])) == ["add", "abs"]
    assert graph.match_parent_path(sub, ["Add", "Abs"], [0, 0]) is None  # input 0 is Neg's
    assert graph.match_parent_path(sub, ["Add", "Neg", "Relu"], [0, 0, 1]) is None  # no input 1
    assert graph.match_parent_path(sub, ["Relu"], [1]) is None  # a graph input: no producer
    assert graph.match_parent_path(sub, ["Mul"], [0]) is None


def test_match_parent_path_without_an_index_takes_the_first_input_that_matches():
    graph = _diamond()
    sub = graph.producer["z"]
    assert _names(graph.match_parent_path(sub, ["Add", "Abs"])) == ["add", "abs"]
    assert _names(graph.match_parent_path(sub, ["Add", "Neg"], [0, None])) == ["add", "neg"]
    assert graph.match_parent_path(sub, []) == []
