"""The exact-grid twin's BatchNorm: exactly a power-of-two scale whatever the epsilon."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters.runtimes import ort_session
from converters.twin import exact_grid_twin


def _batch_norm_model(eps: float, channels: int = 8) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    params = {
        "gamma": rng.uniform(0.5, 2, channels),
        "beta": rng.normal(size=channels),
        "mean": rng.normal(size=channels),
        "var": rng.uniform(0.5, 2, channels),
    }
    node = helper.make_node(
        "BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"], epsilon=eps
    )
    graph = helper.make_graph(
        [node],
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
