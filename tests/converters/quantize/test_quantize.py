"""converters.quantize: which float layers become int8 units, where activations are quantized,
the QDQ model ONNX Runtime runs as the int8 reference, and ranges read back from a QDQ model.
No TensorFlow here: the conversion itself is tests/converters/gate/test_quantized.py's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from support.converter_nets import BiRealDownsample, FloatStemBinaryBody, export, sign

from converters.errors import ConverterError, InputShapeError
from converters.graph import OnnxGraph
from converters.normalize import normalize
from converters.quantize import QuantPoint, find_units, quantize, read_qdq
from converters.runtimes import run_onnx

SHAPE = (1, 3, 8, 8)


def _normalized(net: nn.Module, tmp_path, **kwargs) -> onnx.ModelProto:
    torch.manual_seed(0)
    path = export(net, SHAPE, tmp_path / "net.onnx", do_constant_folding=False, **kwargs)
    return normalize(onnx.load(str(path)))[0]


def _samples(count: int = 32) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (count, *SHAPE[1:])).astype(np.float32)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_a_point_holds_zero_exactly_and_covers_its_range():
    point = QuantPoint.of_range(0.3, 5.1)  # widened to hold 0
    low, high = point.range
    assert low <= 0.0 <= high and high >= 5.1 - point.scale / 2
    assert point.zero_point == -128  # 0 is the lowest value, exactly
    assert QuantPoint.of_range(-2.0, 2.0).range[0] == pytest.approx(-2.0, abs=0.02)


def test_the_units_are_the_float_layers_with_their_batch_norm_and_relu(tmp_path):
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 6 * 6, 10))  # fmt: skip
    plan = find_units(OnnxGraph.folded(_normalized(net, tmp_path)))
    assert [u.op_type for u in plan.units] == ["Conv", "Gemm"]
    stem = plan.units[0]
    assert stem.batch_norm is not None and stem.relu is not None
    assert stem.output.endswith("Relu_output_0") and plan.kept_float == {}


def test_binary_layers_are_no_units(tmp_path):
    plan = find_units(OnnxGraph.folded(_normalized(FloatStemBinaryBody(), tmp_path)))
    assert [u.op_type for u in plan.units] == ["Conv", "Gemm"]  # not the two ±1 convs
    assert plan.units[0].batch_norm is not None and plan.units[0].relu is None


def test_a_grouped_float_conv_stays_float_and_says_why(tmp_path):
    net = nn.Sequential(nn.Conv2d(3, 6, 1), nn.Conv2d(6, 6, 3, groups=2))
    plan = find_units(OnnxGraph.folded(_normalized(net, tmp_path)))
    assert len(plan.units) == 1
    assert list(plan.kept_float.values()) == [
        "a grouped convolution (group=2) that is not depthwise"
    ]


def test_a_shortcut_conv_is_quantized_from_the_stream_before_its_average_pool(tmp_path):
    model = _normalized(BiRealDownsample(), tmp_path)
    plan = find_units(OnnxGraph.folded(model))
    shortcut = next(u for u in plan.units if "shortcut" in u.layer)
    graph = OnnxGraph.folded(model)
    assert graph.producer[shortcut.chain[0]].op_type == "AveragePool"
    assert shortcut.source != shortcut.input and shortcut.chain[-1] == shortcut.input
    assert graph.producer[shortcut.source].op_type == "Add"  # the residual stream
    # the stream is quantized for the pool only: the binary path's sign reads it as it is
    qdq = quantize(model, _samples()).model
    readers = {n.op_type for n in qdq.graph.node if shortcut.source in n.input}
    assert "QuantizeLinear" in readers and "AveragePool" not in readers


def test_the_qdq_model_has_int8_kernels_int32_biases_and_no_batch_norm_left(tmp_path):
    model = _normalized(FloatStemBinaryBody(), tmp_path)
    quantized = quantize(model, _samples())
    qdq = OnnxGraph(quantized.model)
    kernels = [v for v in qdq.constants.values() if v.dtype == np.int8 and v.ndim >= 2]
    assert len(kernels) == 2
    for kernel in kernels:  # per output channel ([O, ...] as torch exports conv and Linear),
        # the largest |w| is 127: the scale is max |w| / 127
        assert (np.abs(kernel.reshape(len(kernel), -1)).max(1) == 127).all()
    assert any(v.dtype == np.int32 for v in qdq.constants.values())
    assert _ops(quantized.model).count("BatchNormalization") == 2  # the binary blocks' only
    assert quantized.report.int8_layers == [u.layer for u in find_units(
        OnnxGraph.folded(model)).units]  # fmt: skip


def test_the_qdq_model_runs_in_onnx_runtime_close_to_the_float_model(tmp_path):
    net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(),
                        nn.Linear(16 * 6 * 6, 10))  # fmt: skip
    model = _normalized(net, tmp_path)
    x = _samples(64)
    quantized = quantize(model, x)
    ours, floats = (
        run_onnx(quantized.model.SerializeToString(), x),
        run_onnx(model.SerializeToString(), x),
    )
    output_step = next(iter(quantized.report.points.values()))["scale"]
    assert output_step > 0
    assert np.abs(ours - floats).max() < 0.05 * (floats.max() - floats.min())
    assert (ours.argmax(1) == floats.argmax(1)).mean() >= 0.9


def test_reading_a_qdq_model_gives_back_its_points_and_its_float_graph(tmp_path):
    model = _normalized(FloatStemBinaryBody(), tmp_path)
    first = quantize(model, _samples())
    float_model, points = read_qdq(first.model)
    assert "QuantizeLinear" not in _ops(float_model)
    assert len(points) == len(first.report.points)
    again = quantize(first.model, calibration=None)  # the ranges it carries: no samples needed
    assert again.report.ranges == "trained"
    x = _samples(8)
    assert np.array_equal(run_onnx(again.model.SerializeToString(), x),
                          run_onnx(first.model.SerializeToString(), x))  # fmt: skip


def test_calibration_samples_of_another_shape_are_one_line(tmp_path):
    model = _normalized(FloatStemBinaryBody(), tmp_path)
    with pytest.raises(InputShapeError) as refused:
        quantize(model, np.zeros((4, 3, 9, 9), np.float32))
    assert "\n" not in str(refused.value) and "[4, 3, 9, 9]" in str(refused.value)


def test_an_opset_before_13_is_refused_in_one_line(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.conv = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3)

        def forward(self, x):
            return self.conv(sign(self.stem(x)))

    model = _normalized(Net(), tmp_path, opset_version=11)
    with pytest.raises(ConverterError, match="opset 13"):
        quantize(model, _samples())


def test_points_given_by_a_calibrated_conversion_make_the_same_model(tmp_path):
    """A batched copy is quantized with the points its batch-1 conversion calibrated: the
    same QDQ model, the half-step sign shift of a binarized unit's bias included."""
    model = _normalized(FloatStemBinaryBody(), tmp_path)
    first = quantize(model, _samples())
    given = {t: QuantPoint(p["scale"], p["zero_point"]) for t, p in
             first.report.tensor_points.items()}  # fmt: skip
    again = quantize(model, None, given=given)
    x = _samples(8)
    assert np.array_equal(run_onnx(again.model.SerializeToString(), x),
                          run_onnx(first.model.SerializeToString(), x))  # fmt: skip
