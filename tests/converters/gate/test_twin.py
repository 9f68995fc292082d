"""The exact-grid twin: its BatchNorm exactly a power-of-two scale whatever the epsilon, and
the functions it can only make exact at 0 (Sigmoid gates) fed an exact 0."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from bnnexport.converters.gate.twin import exact_grid_twin, zeroed_feeds
from bnnexport.converters.graph import OnnxGraph
from bnnexport.converters.runtimes import ort_session
from onnx import TensorProto, helper, numpy_helper


def _batch_norm_model(eps: float, channels: int = 8, affine: bool = True) -> onnx.ModelProto:
    """x -> BatchNormalization; `affine=False`: gamma 1 and beta 0 as Constant nodes, as torch
    exports `BatchNorm2d(affine=False)` (no initializer the twin could set)."""
    rng = np.random.default_rng(0)
    params = {
        "gamma": rng.uniform(0.5, 2, channels),
        "beta": rng.normal(size=channels),
        "mean": rng.normal(size=channels),
        "var": rng.uniform(0.5, 2, channels),
    }
    nodes = [
        helper.make_node(
            "BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"], epsilon=eps
        )
    ]
    if not affine:
        fixed = {"gamma": np.ones(channels, np.float32), "beta": np.zeros(channels, np.float32)}
        nodes[:0] = [
            helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v, k))
            for k, v in fixed.items()
        ]
        params = {k: v for k, v in params.items() if k not in fixed}
    graph = helper.make_graph(
        nodes,
        "bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 4, 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("eps", [1e-5, 1e-3, 1e-2])  # PyTorch's and Keras' defaults
def test_twin_batch_norm_hits_exact_zero_at_its_crossing(eps):
    """At x = the twin's zero crossing, ONNX Runtime's BatchNorm gives exactly 0, and the
    scale is exactly gamma / 64: with var = 4096 and eps = 1e-3 it was 1.5e-8 off."""
    twin = exact_grid_twin(_batch_norm_model(eps))
    values = {i.name: numpy_helper.to_array(i) for i in twin.graph.initializer}
    scale = values["gamma"] / 64.0
    crossing = values["mean"] - values["beta"] / scale
    x = np.broadcast_to(crossing[None, :, None, None], (1, 8, 4, 4)).astype(np.float32)
    y = ort_session(twin.SerializeToString()).run(None, {"x": x})[0]
    assert np.array_equal(y, np.zeros_like(y))
    ones = np.ones((1, 8, 4, 4), np.float32)
    expected = (ones - values["mean"][None, :, None, None]) * scale[None, :, None, None]
    got = ort_session(twin.SerializeToString()).run(None, {"x": ones})[0]
    np.testing.assert_array_equal(got, expected + values["beta"][None, :, None, None])


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_twin_batch_norm_without_affine_keeps_its_scale_and_is_exact(eps):
    """torch's BatchNorm2d(affine=False): gamma is a constant the twin cannot set, so the
    variance sets the power-of-two scale (here 1), not the 1/64 a variance of 4096 gives,
    which shrank QuickNet's stem 64-fold and pushed the next sums past float32's 24 bits."""
    twin = exact_grid_twin(_batch_norm_model(eps, affine=False))
    values = {i.name: numpy_helper.to_array(i) for i in twin.graph.initializer}
    assert np.all(values["var"] + np.float32(eps) == np.float32(1.0))
    ones = np.ones((1, 8, 4, 4), np.float32)
    got = ort_session(twin.SerializeToString()).run(None, {"x": ones})[0]
    np.testing.assert_array_equal(got, ones - values["mean"][None, :, None, None])
    assert np.array_equal(values["mean"], np.round(values["mean"]))  # crossings on integers


def _gated_model(
    shared_bias: bool = False, feed: str = "matmul", transposed: bool = False
) -> onnx.ModelProto:
    """x -> Conv -> y * Sigmoid(MatMul(Relu(MatMul(mean(x), w1)), w2) + b): a Real-to-Binary
    Net style gate (`feed="input"`: the Sigmoid reads the graph input itself; `transposed`:
    w2 stored as torch's Linear stores it, read through a Transpose as torch exports it)."""
    rng = np.random.default_rng(1)
    inits = {
        "k": rng.normal(size=(4, 4, 3, 3)),
        "w1": rng.normal(size=(4, 8)),
        "w2": rng.normal(size=(8, 4)),
        "b": rng.normal(size=4),
        "shape": np.array([1, 4, 1, 1]),
    }
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("MatMul", ["hr", "w2t" if transposed else "w2"], ["z"]),
        helper.make_node("Add", ["z", "b"], ["zb"]),
        helper.make_node("Sigmoid", ["zb" if feed == "matmul" else "x"], ["gate"]),
        helper.make_node("Reshape", ["gate", "shape"], ["g4"])
        if feed == "matmul"
        else helper.make_node("Identity", ["gate"], ["g4"]),
        helper.make_node("Mul", ["y", "g4"], ["out"]),
    ]
    if transposed:
        inits["w2"] = inits["w2"].T.copy()
        nodes.insert(0, helper.make_node("Transpose", ["w2"], ["w2t"], perm=[1, 0]))
    if shared_bias:  # a second node reads the gate's bias
        nodes.append(helper.make_node("Mul", ["flat", "b"], ["also_b"]))
    graph = helper.make_graph(
        nodes,
        "gated",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 5, 5])],
        [
            numpy_helper.from_array(v.astype(np.int64 if k == "shape" else np.float32), k)
            for k, v in inits.items()
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _twin_values(model: onnx.ModelProto, name: str, x: np.ndarray) -> np.ndarray:
    """Tensor `name` of the twin of `model` on input x, as ONNX Runtime computes it."""
    twin = exact_grid_twin(model)
    twin.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return ort_session(twin.SerializeToString()).run([name], {"x": x})[0]


def test_twin_feeds_a_sigmoid_gate_an_exact_zero():
    """The gate's last linear layer and its bias are zeroed, so the gate is exactly 0.5 in
    every runtime; the first layer and the main path keep their grid values."""
    x = np.random.default_rng(2).normal(size=(1, 4, 5, 5)).astype(np.float32)
    assert np.array_equal(_twin_values(_gated_model(), "zb", x), np.zeros((1, 4), np.float32))
    values = {
        i.name: numpy_helper.to_array(i) for i in exact_grid_twin(_gated_model()).graph.initializer
    }
    assert not values["w2"].any() and not values["b"].any()
    assert values["w1"].any() and values["k"].any()


def test_twin_zeroes_a_gate_weight_torch_exports_through_a_transpose():
    """nn.Linear(bias=False) exports as MatMul(x, Transpose(weight)): the weight itself is
    zeroed, and the gate is exactly 0.5 again (it was not, and Real-to-Binary Net's twin
    disagreed between runtimes at 224x224)."""
    x = np.random.default_rng(2).normal(size=(1, 4, 5, 5)).astype(np.float32)
    model = _gated_model(transposed=True)
    assert set(zeroed_feeds(OnnxGraph.folded(model))) == {"w2", "b"}
    assert np.array_equal(_twin_values(model, "zb", x), np.zeros((1, 4), np.float32))


@pytest.mark.parametrize(
    "kwargs", [{"shared_bias": True}, {"feed": "input"}], ids=["shared-bias", "no-linear-feed"]
)
def test_twin_leaves_a_gate_it_cannot_zero_alone(kwargs):
    """A bias another node reads too, or a Sigmoid of the input: nothing is zeroed."""
    assert set(zeroed_feeds(OnnxGraph.folded(_gated_model()))) == {"w2", "b"}
    assert zeroed_feeds(OnnxGraph.folded(_gated_model(**kwargs))) == {}


@pytest.mark.slow  # converts the twin with LCE
def test_a_reference_twin_that_rounds_its_own_way_is_judged_by_replay_never_waved_through(
    tmp_path,
):
    """Where a reference's own twin disagrees with LCE's, and the reference can probe its twin,
    `check_twin` compares it with ONNX Runtime's twin by tie replay (the twin's float sums may
    outgrow float32, as Bi-Real-Net's do at 224x224). A reference that is simply wrong still
    fails: the replay cannot make ONNX Runtime's twin compute its outputs."""
    import torch
    from bnnexport.converters.errors import ConversionMismatchError
    from bnnexport.converters.gate import OnnxProbe
    from bnnexport.converters.gate.checks import Reference, check_twin
    from bnnexport.converters.gate.predicate import GateOptions
    from bnnexport.converters.graph import load_onnx
    from bnnexport.converters.normalize import normalize
    from bnnexport.converters.runtimes import run_onnx
    from support.converter_nets import BinaryBlock, export

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), BinaryBlock(32, 32))
    path = export(net, (1, 3, 6, 6), tmp_path / "net.onnx")
    model, _ = normalize(load_onnx(path))
    x = np.random.default_rng(0).standard_normal((4, 3, 6, 6)).astype(np.float32)

    def own_twin(shift: float):
        return lambda twin, inputs: run_onnx(twin.SerializeToString(), inputs) + shift

    exact = Reference("Mine", lambda v: v, twin_outputs=own_twin(0.0), twin_probe=OnnxProbe)
    assert [r.reference for r in check_twin(model, x, [exact], GateOptions())] == [
        "ONNX Runtime twin", "Mine twin"
    ]  # fmt: skip

    # outputs off (a batch that rounded otherwise), the probe's own computation exact: replayed
    rounded = Reference("Mine", lambda v: v, twin_outputs=own_twin(1e-3), twin_probe=OnnxProbe)
    report = check_twin(model, x, [rounded], GateOptions())[1]
    assert (report.reference, report.candidate) == ("Mine twin", "ONNX Runtime twin (= LCE twin)")
    assert report.argmax_agreement == 1.0 and report.max_abs_diff == 0.0

    class Shifted(OnnxProbe):  # a reference twin 1.0 off everywhere: no replay explains it
        def run(self, sample, imposed=None):
            logits, values = super().run(sample, imposed)
            return logits + 1.0, values

    for probe in (Shifted, None):
        wrong = Reference("Mine", lambda v: v, twin_outputs=own_twin(1.0), twin_probe=probe)
        with pytest.raises(ConversionMismatchError, match="Mine twin"):
            check_twin(model, x, [wrong], GateOptions())
