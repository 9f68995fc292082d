"""bnnexport.converters.quantize: which float layers become int8 units, where activations are
quantized, the QDQ model ONNX Runtime runs as the int8 reference, and ranges read back from a QDQ
model. No TensorFlow here: the conversion itself is tests/converters/gate/test_quantized.py's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from bnnexport.converters.errors import ConverterError, InputShapeError
from bnnexport.converters.graph import OnnxGraph
from bnnexport.converters.normalize import normalize
from bnnexport.converters.quantize import QuantPoint, find_units, quantize, read_qdq
from bnnexport.converters.quantize.qdq import kernel_integers
from bnnexport.converters.runtimes import run_onnx
from support.converter_nets import BiRealDownsample, FloatStemBinaryBody, export, sign

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
    # the QDQ model's own arithmetic: ORT's fused int8 kernels, which saturate on a CPU
    # without VNNI (10 % of the range apart on an AVX2-only EPYC), are not what runs
    assert np.array_equal(ours, run_onnx(quantized.model.SerializeToString(), x, optimize=False))
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


# -- kernel rounding: a conv's answer to a flat region ----------------------------------------

# one output channel, one input channel, 3x3: the largest tap sets the scale (127 steps); the
# other eight each 0.4 step, so rounding each alone loses 3.2 steps of the window's sum
STEPS = np.array([127.0, *[0.4] * 8], np.float32).reshape(1, 1, 3, 3)
KERNEL_STEP = 0.01


def _conv_graph(qdq_ranges: bool = False) -> onnx.ModelProto:
    """input (1, 1, 6, 6) -> 3x3 conv (kernel STEPS x KERNEL_STEP, bias 0) -> output; with
    `qdq_ranges` the input and output carry QuantizeLinear -> DequantizeLinear pairs, as a
    model trained with its ranges does."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(STEPS * np.float32(KERNEL_STEP), "w"),
             numpy_helper.from_array(np.zeros(1, np.float32), "b")]  # fmt: skip
    conv_in, nodes = "x", []
    if qdq_ranges:
        inits += [numpy_helper.from_array(np.float32(2 / 255), "s_in"),
                  numpy_helper.from_array(np.float32(0.02), "s_out"),
                  numpy_helper.from_array(np.int8(0), "z")]  # fmt: skip
        nodes += [helper.make_node("QuantizeLinear", ["x", "s_in", "z"], ["xq"]),
                  helper.make_node("DequantizeLinear", ["xq", "s_in", "z"], ["xd"])]  # fmt: skip
        conv_in = "xd"
    nodes.append(helper.make_node("Conv", [conv_in, "w", "b"], ["y" if qdq_ranges else "out"]))
    if qdq_ranges:
        nodes += [helper.make_node("QuantizeLinear", ["y", "s_out", "z"], ["yq"]),
                  helper.make_node("DequantizeLinear", ["yq", "s_out", "z"], ["out"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 6])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 1, 4, 4])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _int8_kernel(model: onnx.ModelProto) -> np.ndarray:
    return next(
        v for v in OnnxGraph(model).constants.values() if v.dtype == np.int8 and v.ndim == 4
    )


def test_a_calibrated_conv_answers_a_flat_input_within_half_a_kernel_step():
    """A flat region (an image's background) meets every tap of the window: its answer is the
    value times the window's sum. Rounding each tap alone would move it by 3.2 kernel steps
    here (mnist-bnn's stem lost 1.4 points of top-1 that way: docs/LCE_NOTES.md)."""
    model = _conv_graph()
    rng = np.random.default_rng(0)
    quantized = quantize(model, rng.uniform(-1, 1, (32, 1, 6, 6)).astype(np.float32))
    point = quantized.report.tensor_points["x"]
    flat = np.full((1, 1, 6, 6), (100 - point["zero_point"]) * point["scale"], np.float32)
    ours = run_onnx(quantized.model.SerializeToString(), flat)
    floats = run_onnx(model.SerializeToString(), flat)  # the input on its grid: exact
    output_step = quantized.report.tensor_points["out"]["scale"]
    assert np.abs(ours - floats).max() <= KERNEL_STEP / 2 + output_step / 2
    assert _int8_kernel(quantized.model).sum() == round(float(STEPS.sum()))


def test_a_model_trained_with_its_ranges_keeps_its_kernel_plainly_rounded():
    """Quantization-aware training fake-quantizes kernels with plain rounding
    (bnnexport.nn.int8): the integers it trained on are the ones the flatbuffer holds."""
    quantized = quantize(_conv_graph(qdq_ranges=True), calibration=None)
    assert quantized.report.ranges == "trained"
    assert np.array_equal(_int8_kernel(quantized.model), np.rint(STEPS))


def test_the_taps_moved_are_those_rounded_farthest_never_the_one_setting_the_scale():
    """TFLite derives the scale from the largest |tap| again: it stays at 127. The window
    is 2.85 steps short of its rounded sum, so three taps move: the three rounded farthest
    (-0.45 each, then 0.55 off), not the -0.1, -0.2 and -0.3 taps (then 0.7 to 0.9 off)."""
    steps = np.array([-127, -0.45, -0.1, -0.45, -0.2, -0.45, -0.45, -0.3, -0.45])
    ints = kernel_integers(steps.reshape(1, 1, 3, 3)).reshape(-1)
    assert ints[0] == -127 and ints.sum() == -130
    assert np.abs(ints - steps).max() == pytest.approx(0.55)


def test_a_dense_kernel_is_rounded_tap_by_tap():
    steps = np.array([[127.0, 0.4, 0.4, 0.4], [0.4, 0.4, 0.4, -127.0]])
    assert np.array_equal(kernel_integers(steps), np.rint(steps))
