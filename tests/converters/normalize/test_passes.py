"""bnnexport.converters.normalize: each pass rewrites its idiom exactly (ONNX Runtime on random
inputs, exact zeros included, gives the same outputs before and after), or leaves the graph
alone."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bnnexport.converters.batch import rebatch
from bnnexport.converters.normalize import REWRITES, normalize, rewrite, runnable_reference
from bnnexport.converters.patterns import find_binary_layers
from onnx import TensorProto, helper, numpy_helper

SHAPE = [1, 4, 5, 5]


def const(name: str, value) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name)
    )


def model(nodes, output="y", shape=SHAPE, out_shape=None, inits=(), opset=17, domains=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)
    graph = helper.make_graph(nodes, "g", [x], [y], list(inits))
    imports = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, 1) for d in domains]]
    return helper.make_model(graph, opset_imports=imports)


def with_conv(nodes, binarized: str) -> list[onnx.NodeProto]:
    """`nodes` followed by a ±1 3x3 conv reading `binarized` (output y)."""
    kernel = np.where(np.random.default_rng(0).standard_normal((3, 4, 3, 3)) >= 0, 1.0, -1.0)
    return [*nodes, const("w", kernel.astype(np.float32)),
            helper.make_node("Conv", [binarized, "w"], ["y"], pads=[1, 1, 1, 1])]  # fmt: skip


def run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def inputs(zeros: bool = True, shape=SHAPE) -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((8, *shape[1:])).astype(np.float32)
    if zeros:  # exact zeros of both signs, where binarization idioms differ
        x.reshape(8, -1)[:, ::7] = 0.0
        x.reshape(8, -1)[:, 3::7] = -0.0
    return x


def assert_exact(before: onnx.ModelProto, after: onnx.ModelProto, x: np.ndarray) -> None:
    for sample in x:
        np.testing.assert_array_equal(run(before, sample[None]), run(after, sample[None]))


def ops(m: onnx.ModelProto) -> list[str]:
    """The op types computed (Constant nodes, kept as the graph had them, left out)."""
    return [n.op_type for n in m.graph.node if n.op_type != "Constant"]


def convert(m: onnx.ModelProto, tmp_path, x: np.ndarray, disabled: tuple[str, ...] = ()):
    """`convert_onnx` of `m` (saved under tmp_path) with the gate on `x`, passes `disabled`."""
    from bnnexport.converters.lce import ConvertOptions, convert_onnx

    path = tmp_path / "model.onnx"
    onnx.save(m, str(path))
    out = tmp_path / f"{'-'.join(disabled) or 'all'}.tflite"
    return convert_onnx(path, out, inputs=x, options=ConvertOptions(disabled_rewrites=disabled))


BITORCH = [
    helper.make_node("Sign", ["x"], ["s"]),
    const("zero", np.float32(0)),
    helper.make_node("Equal", ["s", "zero"], ["eq"]),
    const("one", np.float32(1)),
    helper.make_node("Where", ["eq", "one", "s"], ["b"]),
]
CANONICAL = ["GreaterOrEqual", "Where"]


def test_bitorch_sign_becomes_the_canonical_binarization_exactly():
    before = model(with_conv(BITORCH, "b"))
    after, report = normalize(before)
    assert ops(after) == [*CANONICAL, "Conv"] and report.applied["bitorch-sign"] == 1
    assert report.zero_sensitive == {}
    assert find_binary_layers(after)[0].binary
    assert_exact(before, after, inputs())


def test_a_disabled_rewrite_leaves_its_idiom_in_place():
    before = model(with_conv(BITORCH, "b"))
    after, report = normalize(before, disabled=["bitorch-sign"])
    assert "Equal" in ops(after) and "bitorch-sign" not in report.applied
    assert find_binary_layers(after) == []


def test_brevitas_cast_times_two_minus_one_is_canonical():
    nodes = [
        const("zero", np.float32(0)), const("two", np.float32(2)), const("one", np.float32(1)),
        helper.make_node("GreaterOrEqual", ["x", "zero"], ["ge"]),
        helper.make_node("Cast", ["ge"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["c", "two"], ["m"]),
        helper.make_node("Sub", ["m", "one"], ["b"]),
    ]  # fmt: skip
    before = model(with_conv(nodes, "b"))
    after, report = normalize(before)
    assert ops(after) == [*CANONICAL, "Conv"] and report.applied["cast-compare"] == 1
    assert_exact(before, after, inputs())


def test_index_put_where_chain_is_canonical():
    """out = zeros; out[x >= 0] = 1; out[x < 0] = -1, as the legacy exporter writes it."""
    nodes = [
        const("zero", np.float32(0)), const("one", np.float32(1)), const("minus", np.float32(-1)),
        const("zeros", np.zeros(SHAPE, np.float32)),
        helper.make_node("GreaterOrEqual", ["x", "zero"], ["ge"]),
        helper.make_node("Where", ["ge", "one", "zeros"], ["put1"]),
        helper.make_node("Less", ["x", "zero"], ["lt"]),
        helper.make_node("Where", ["lt", "minus", "put1"], ["b"]),
    ]  # fmt: skip
    before = model(with_conv(nodes, "b"))
    after, report = normalize(before)
    assert ops(after) == [*CANONICAL, "Conv"] and report.applied["where-compare"] == 1
    assert_exact(before, after, inputs())


def test_dynamo_index_put_scatter_becomes_where():
    nodes = [
        const("zero", np.float32(0)), const("one", np.array([1.0], np.float32)),
        const("minus", np.array([-1.0], np.float32)), const("flat", np.array([-1], np.int64)),
        const("zeros", np.zeros(SHAPE, np.float32)),
    ]  # fmt: skip
    data = "zeros"
    for k, (cmp, value) in enumerate([("GreaterOrEqual", "one"), ("Less", "minus")]):
        nodes += [
            helper.make_node(cmp, ["x", "zero"], [f"mask{k}"]),
            helper.make_node("NonZero", [f"mask{k}"], [f"nz{k}"]),
            helper.make_node("Transpose", [f"nz{k}"], [f"idx{k}"], perm=[1, 0]),
            helper.make_node("Reshape", [f"mask{k}", "flat"], [f"m{k}"]),
            helper.make_node("Cast", [f"m{k}"], [f"i{k}"], to=TensorProto.INT64),
            helper.make_node("ReduceSum", [f"i{k}"], [f"n{k}"], keepdims=1),
            helper.make_node("Expand", [value, f"n{k}"], [f"u{k}"]),
            helper.make_node("ScatterND", [data, f"idx{k}", f"u{k}"], [f"put{k}"]),
        ]
        data = f"put{k}"
    before = model(with_conv(nodes, data))
    after, report = normalize(before)
    assert report.applied["index-put"] == 2 and report.applied["where-compare"] == 1
    assert ops(after) == [*CANONICAL, "Conv"]
    assert_exact(before, after, inputs())


def test_plain_sign_feeding_a_conv_is_canonical_and_listed_as_zero_sensitive():
    before = model(with_conv([helper.make_node("Sign", ["x"], ["b"])], "b"))
    after, report = normalize(before)
    assert ops(after) == [*CANONICAL, "Conv"]
    assert report.zero_sensitive == {"x": 0.0}
    assert_exact(before, after, inputs(zeros=False))  # the same function away from 0
    x = inputs(zeros=True)
    assert not np.array_equal(run(before, x[:1]), run(after, x[:1]))  # and not at 0


def test_greater_than_zero_is_zero_sensitive_with_minus_one_at_zero():
    nodes = [
        const("zero", np.float32(0)), const("one", np.float32(1)), const("minus", np.float32(-1)),
        helper.make_node("Greater", ["x", "zero"], ["gt"]),
        helper.make_node("Where", ["gt", "one", "minus"], ["b"]),
    ]  # fmt: skip
    _, report = normalize(model(with_conv(nodes, "b")))
    assert report.zero_sensitive == {"x": -1.0} and report.applied["plain-sign"] == 1


def test_plain_sign_outside_a_binary_layer_is_left_alone():
    nodes = [helper.make_node("Sign", ["x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    after, report = normalize(model(nodes))
    assert ops(after) == ["Sign", "Relu"] and report.zero_sensitive == {}


@pytest.mark.parametrize(
    "nodes",
    [
        [const("c", np.float32(0.5)), helper.make_node("Greater", ["x", "c"], ["gt"]),
         const("one", np.float32(1)), const("minus", np.float32(-1)),
         helper.make_node("Where", ["gt", "one", "minus"], ["b"])],
        [const("zero", np.float32(0)), helper.make_node("Less", ["x", "zero"], ["lt"]),
         const("minus", np.float32(-1)), helper.make_node("Where", ["lt", "minus", "x"], ["b"])],
    ],
    ids=["threshold-not-zero", "reads-the-value"],
)  # fmt: skip
def test_functions_that_are_not_sign_functions_are_not_rewritten(nodes):
    after, report = normalize(model(with_conv(nodes, "b")))
    assert "GreaterOrEqual" not in ops(after) and report.zero_sensitive == {}


def test_qonnx_bipolar_quant_is_canonical_times_its_scale():
    bq = helper.make_node("BipolarQuant", ["x", "s"], ["b"], domain="qonnx.custom_op.general")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    before = model(with_conv([bq], "b"), inits=[scale], domains=["qonnx.custom_op.general"])
    after, report = normalize(before)
    assert ops(after) == [*CANONICAL, "Mul", "Conv"] and report.applied["qonnx-bipolar"] == 1
    reference = runnable_reference(before)  # BipolarQuant by its definition, for ORT
    assert_exact(reference, after, inputs())
    zeros, ones = (np.full((1, *SHAPE[1:]), v, np.float32) for v in (0.0, 1.0))
    np.testing.assert_array_equal(run(reference, zeros), run(reference, ones))  # 0 -> +s


def test_ste_detach_reads_the_sign_and_its_surrogate_dies():
    nodes = [
        helper.make_node("Sign", ["x"], ["s"]), helper.make_node("Tanh", ["x"], ["p"]),
        helper.make_node("Sub", ["s", "p"], ["d"]), helper.make_node("Add", ["d", "p"], ["b"]),
    ]  # fmt: skip
    before = model(with_conv(nodes, "b"))
    after, report = normalize(before)
    assert ops(after) == [*CANONICAL, "Conv"] and report.applied["ste-detach"] == 1
    assert report.zero_sensitive == {"x": 0.0}
    x = inputs(zeros=False)
    np.testing.assert_allclose(run(before, x[:1]), run(after, x[:1]), rtol=0, atol=1e-5)


def test_weights_binarized_in_forward_fold_into_a_scaled_binary_kernel():
    """XNOR-Net / ReActNet: mean|w| per output channel x sign(w), computed in the graph."""
    w = np.random.default_rng(2).standard_normal((3, 4, 3, 3)).astype(np.float32)
    nodes = [
        const("latent", w), const("axes", np.array([1, 2, 3], np.int64)),
        helper.make_node("Abs", ["latent"], ["a"]),
        helper.make_node("ReduceMean", ["a", "axes"], ["m"], keepdims=1),
        helper.make_node("Sign", ["latent"], ["sw"]), helper.make_node("Mul", ["m", "sw"], ["k"]),
        *BITORCH, helper.make_node("Conv", ["b", "k"], ["y"], pads=[1, 1, 1, 1]),
    ]  # fmt: skip
    before = model(nodes, opset=18)
    after, report = normalize(before)
    assert ops(after) == [*CANONICAL, "Conv"] and report.applied["fold-constants"] >= 5
    (layer,) = find_binary_layers(after)
    assert layer.binary and not layer.strict
    np.testing.assert_allclose(layer.scale, np.abs(w).mean(axis=(1, 2, 3)), rtol=1e-6)
    assert_exact(before, after, inputs())


def test_brevitas_clamp_before_its_binarization_is_read_through():
    nodes = [
        const("s", np.float32(1.0)), const("ms", np.float32(-1.0)), const("zero", np.float32(0)),
        const("one", np.float32(1)), const("minus", np.float32(-1)),
        helper.make_node("Greater", ["x", "s"], ["gt"]),
        helper.make_node("Where", ["gt", "s", "x"], ["c1"]),
        helper.make_node("Less", ["c1", "ms"], ["lt"]),
        helper.make_node("Where", ["lt", "ms", "c1"], ["c2"]),
        helper.make_node("GreaterOrEqual", ["c2", "zero"], ["ge"]),
        helper.make_node("Where", ["ge", "one", "minus"], ["b"]),
    ]  # fmt: skip
    before = model(with_conv(nodes, "b"))
    after, report = normalize(before)
    assert ops(after) == [*CANONICAL, "Conv"] and report.applied["clamp-sign"] == 2
    assert_exact(before, after, inputs())


def test_a_clamp_that_moves_zero_is_kept():
    nodes = [
        const("lo", np.float32(0.5)), const("hi", np.float32(2.0)), const("zero", np.float32(0)),
        const("one", np.float32(1)), const("minus", np.float32(-1)),
        helper.make_node("Clip", ["x", "lo", "hi"], ["c"]),
        helper.make_node("GreaterOrEqual", ["c", "zero"], ["ge"]),
        helper.make_node("Where", ["ge", "one", "minus"], ["b"]),
    ]  # fmt: skip
    after, report = normalize(model(with_conv(nodes, "b")))
    assert "Clip" in ops(after) and "clamp-sign" not in report.applied


def test_transpose_between_binarization_and_conv_moves_before_it():
    """tf2onnx: NHWC tensors, binarized, then transposed to NCHW for the Conv."""
    shape = [1, 5, 5, 4]
    nodes = [
        const("zero", np.float32(0)), const("one", np.float32(1)), const("minus", np.float32(-1)),
        helper.make_node("GreaterOrEqual", ["x", "zero"], ["ge"]),
        helper.make_node("Where", ["ge", "one", "minus"], ["bn"]),
        helper.make_node("Transpose", ["bn"], ["b"], perm=[0, 3, 1, 2]),
    ]  # fmt: skip
    before = model(with_conv(nodes, "b"), shape=shape)
    after, report = normalize(before)
    assert ops(after) == ["Transpose", *CANONICAL, "Conv"]
    assert report.applied["transpose-binarized"] == 1
    assert_exact(before, after, inputs(shape=shape))


def test_dynamic_batch_shape_chains_fold_to_constants():
    """tf2onnx / legacy: Reshape's target from Shape -> Gather -> Cast -> Slice -> Concat."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        const("i0", np.array(0, np.int64)),
        helper.make_node("Gather", ["shape", "i0"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["nf", "ax"], ["n1"]),
        const("ax", np.array([0], np.int64)),
        const("rest", np.array([100], np.int64)),
        helper.make_node("Concat", ["n1", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]  # fmt: skip
    nodes.insert(4, nodes.pop(5))  # "ax" before its reader
    before = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                               opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    after, report = normalize(before)
    assert ops(after) == ["Reshape"] and report.applied["fix-batch"] == 1
    assert after.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    np.testing.assert_array_equal(run(before, inputs()[:1]), run(after, inputs()[:1]))
    # another batch is fixed in the file first (converters.batch, the one batch path)
    at_two, report = normalize(rebatch(before, 2))
    assert ops(at_two) == ["Reshape"] and "fix-batch" not in report.applied
    assert at_two.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2
    np.testing.assert_array_equal(run(before, inputs()[:2]), run(at_two, inputs()[:2]))


def test_dynamo_castlike_and_identity_noise_is_removed():
    nodes = [
        helper.make_node("Identity", ["x"], ["i"]),
        const("like", np.float32(1)),
        helper.make_node("CastLike", ["i", "like"], ["c"]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    before = model(nodes)
    after, _ = normalize(before)
    assert ops(after) == ["Relu"]
    assert_exact(before, after, inputs())


def test_rewrites_are_registered_once_by_name():
    assert {"fold-constants", "bitorch-sign", "qonnx-bipolar", "ste-detach", "plain-sign",
            "index-put", "clamp-sign", "pad-transpose", "reshape-transpose",
            "transpose-binarized", "keras-prelu"} <= set(REWRITES)  # fmt: skip
    with pytest.raises(ValueError, match="registered twice"):
        rewrite("fold-constants")(lambda work: 0)
    with pytest.raises(ValueError, match="unknown rewrite"):
        normalize(model([helper.make_node("Relu", ["x"], ["y"])]), disabled=["no-such-pass"])


def test_transposes_sink_below_constant_arithmetic_and_cancel():
    """tf2onnx: NCHW Conv -> Transpose to NHWC -> BatchNorm as Mul/Add on the last axis ->
    Transpose back: the constants move to the channel axis and both Transposes vanish."""
    rng = np.random.default_rng(3)
    nodes = [
        const("m", rng.random(4).astype(np.float32) + 0.5),
        const("a", rng.standard_normal(4).astype(np.float32)),
        helper.make_node("Transpose", ["x"], ["nhwc"], perm=[0, 2, 3, 1]),
        helper.make_node("Mul", ["nhwc", "m"], ["scaled"]),
        helper.make_node("Add", ["a", "scaled"], ["shifted"]),
        helper.make_node("Transpose", ["shifted"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Relu", ["nchw"], ["y"]),
    ]
    before = model(nodes)
    after, report = normalize(before)
    assert ops(after) == ["Mul", "Add", "Relu"]
    assert report.applied["transpose-sink"] == 3  # two moves, one cancellation
    assert_exact(before, after, inputs())


NHWC = [1, 6, 6, 4]
# tf2onnx's pads for larq's one-padded conv, on the NHWC tensor; asymmetric here, so that a
# pad moved to the wrong axis changes the output (top 1, left 2, bottom 1, right 0)
NHWC_PADS = np.array([0, 1, 2, 0, 0, 1, 0, 0], np.int64)


def padded_conv(pads=NHWC_PADS, mode=None, fill=1.0, pads_input=False) -> onnx.ModelProto:
    """larq's ste_sign -> Pad (NHWC) -> Transpose to NCHW -> ±1 conv -> Transpose back, as
    tf2onnx writes QuickNet's binary convs (`pads_input`: the pads are a second graph input)."""
    kernel = np.where(np.random.default_rng(4).standard_normal((3, 4, 3, 3)) >= 0, 1.0, -1.0)
    pad_inputs = ["b", "pads" if pads_input else "pads_c", "fill"]
    nodes = [
        const("point1", np.float32(0.1)), const("fill", np.float32(fill)),
        const("w", kernel.astype(np.float32)),
        helper.make_node("Sign", ["x"], ["s0"]), helper.make_node("Add", ["s0", "point1"], ["a"]),
        helper.make_node("Sign", ["a"], ["b"]),
        helper.make_node("Pad", pad_inputs, ["p"], **({"mode": mode} if mode else {})),
        helper.make_node("Transpose", ["p"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t", "w"], ["c"]),
        helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1]),
    ]  # fmt: skip
    if not pads_input:
        nodes.insert(0, const("pads_c", pads))
    m = model(nodes, shape=NHWC)
    if pads_input:
        m.graph.input.append(helper.make_tensor_value_info("pads", TensorProto.INT64, [8]))
    return m


@pytest.mark.parametrize("fill", [1.0, 0.0, -1.0])
def test_a_constant_pad_before_a_transpose_moves_below_it_with_its_pads_permuted(fill):
    before = padded_conv(fill=fill)
    after, report = normalize(before)
    assert report.applied["pad-transpose"] == 1 and report.applied["transpose-binarized"] == 1
    assert ops(after) == ["Transpose", *CANONICAL, "Pad", "Conv", "Transpose"]
    pad = next(n for n in after.graph.node if n.op_type == "Pad")
    pads = {i.name: numpy_helper.to_array(i) for i in after.graph.initializer}
    pads.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in after.graph.node
                 if n.op_type == "Constant"})  # fmt: skip
    np.testing.assert_array_equal(pads[pad.input[1]], [0, 0, 1, 2, 0, 0, 1, 0])  # NCHW order
    (layer,) = find_binary_layers(after)
    assert layer.binary and layer.strict
    assert_exact(before, after, inputs(shape=NHWC))


@pytest.mark.slow
def test_the_one_padded_tf2onnx_conv_converts_to_lce_bconv2d(tmp_path):
    from bnnexport.converters.errors import FloatFallbackError

    x = inputs(shape=NHWC)
    result = convert(padded_conv(), tmp_path, x)
    assert result.binary_layers == 1 and result.lce_bconv2d == 1
    assert result.float_fallbacks == [] and result.normalized.applied["pad-transpose"] == 1
    with pytest.raises(FloatFallbackError, match="would stay float"):
        convert(padded_conv(), tmp_path, x, disabled=("pad-transpose",))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "reflect"},
        {"pads": np.array([0, 0, 0, 0, 0, -1, 0, 0], np.int64)},  # a crop
        {"pads_input": True},
    ],
    ids=["reflect", "negative-pads", "computed-pads"],
)
def test_pads_that_are_not_constant_and_nonnegative_stay_before_the_transpose(kwargs):
    before = padded_conv(**kwargs)
    after, report = normalize(before)
    assert "pad-transpose" not in report.applied
    computed = ops(after)
    assert computed.index("Pad") < computed.index("Transpose") < computed.index("Conv")
    if "pads_input" not in kwargs:
        assert_exact(before, after, inputs(shape=NHWC))


def test_pads_follow_their_axes_through_a_perm_that_is_not_its_own_inverse():
    """Input laid out (H, N, W, C), transposed by [1, 3, 0, 2] to NCHW; every axis but C padded
    differently (the batch too), so a pad moved by the inverse perm changes the output."""
    shape = [6, 1, 5, 4]
    kernel = np.where(np.random.default_rng(5).standard_normal((3, 4, 3, 3)) >= 0, 1.0, -1.0)
    nodes = [
        const("zero", np.float32(0)), const("one", np.float32(1)), const("minus", np.float32(-1)),
        const("pads", np.array([2, 1, 0, 0, 1, 0, 3, 0], np.int64)),
        const("fill", np.float32(1.0)), const("w", kernel.astype(np.float32)),
        helper.make_node("GreaterOrEqual", ["x", "zero"], ["ge"]),
        helper.make_node("Where", ["ge", "one", "minus"], ["b"]),
        helper.make_node("Pad", ["b", "pads", "fill"], ["p"]),
        helper.make_node("Transpose", ["p"], ["t"], perm=[1, 3, 0, 2]),
        helper.make_node("Conv", ["t", "w"], ["y"]),
    ]  # fmt: skip
    before = model(nodes, shape=shape)
    after, report = normalize(before)
    assert report.applied["pad-transpose"] == 1
    assert ops(after) == ["Transpose", *CANONICAL, "Pad", "Conv"]
    x = np.random.default_rng(6).standard_normal((4, *shape)).astype(np.float32)
    x.reshape(4, -1)[:, ::5] = 0.0
    x.reshape(4, -1)[:, 2::5] = -0.0
    for sample in x:
        np.testing.assert_array_equal(run(before, sample), run(after, sample))


ALEX = [1, 1, 2, 3]  # NHWC, flattened to [N, 1, 1, 6] as Keras' Reshape((1, 1, 6)) does


def dense_as_1x1_convs(shape=ALEX, target=None, shape_input=False):
    """larq-zoo BinaryAlexNet's dense layers as tf2onnx writes them: a Keras Reshape to
    `[N, 1, 1, C]` whose target is computed from `Shape` (so shapes are known only once it
    folds), then twice: ste_sign -> Reshape to NCHW `[N, C, 1, 1]` -> ±1 1x1 conv -> BatchNorm
    (Mul/Add on the channel axis) -> Reshape back to NHWC. `target`: the NCHW reshape's target
    instead (no flattening then); `shape_input`: the second layer's target is a graph input,
    only known at run time."""
    rng = np.random.default_rng(7)
    flatten = target is None
    c = int(np.prod(shape[1:])) if flatten else shape[-1]
    nchw = (-1, c, 1, 1) if flatten else target
    nhwc = (-1, 1, 1, c) if flatten else (-1, *shape[1:])
    nodes = [const("point1", np.float32(0.1)), const("nchw", np.array(nchw, np.int64)),
             const("nhwc", np.array(nhwc, np.int64))]  # fmt: skip
    if flatten:
        nodes += [
            const("start", np.array([0], np.int64)), const("one", np.array([1], np.int64)),
            const("rest", np.array([1, 1, c], np.int64)),
            helper.make_node("Shape", ["x"], ["xs"]),
            helper.make_node("Slice", ["xs", "start", "one"], ["n"]),
            helper.make_node("Concat", ["n", "rest"], ["flat"], axis=0),
            helper.make_node("Reshape", ["x", "flat"], ["f"]),
        ]  # fmt: skip
    for k, src in enumerate(["f" if flatten else "x", "h0"]):
        kernel = np.where(rng.standard_normal((c, c, 1, 1)) >= 0, 1.0, -1.0).astype(np.float32)
        nodes += [
            const(f"w{k}", kernel),
            const(f"m{k}", rng.random((c, 1, 1)).astype(np.float32) + 0.5),
            const(f"add{k}", rng.standard_normal((c, 1, 1)).astype(np.float32)),
            helper.make_node("Sign", [src], [f"s{k}"]),
            helper.make_node("Add", [f"s{k}", "point1"], [f"a{k}"]),
            helper.make_node("Sign", [f"a{k}"], [f"b{k}"]),
            helper.make_node("Reshape", [f"b{k}", "target2" if k and shape_input else "nchw"],
                             [f"r{k}"]),
            helper.make_node("Conv", [f"r{k}", f"w{k}"], [f"c{k}"]),
            helper.make_node("Mul", [f"c{k}", f"m{k}"], [f"scaled{k}"]),
            helper.make_node("Add", [f"scaled{k}", f"add{k}"], [f"bn{k}"]),
            helper.make_node("Reshape", [f"bn{k}", "nhwc"], [f"h{k}" if k == 0 else "y"]),
        ]  # fmt: skip
    m = model(nodes, shape=["N", *shape[1:]])
    if shape_input:
        m.graph.input.append(helper.make_tensor_value_info("target2", TensorProto.INT64, [4]))
    return m


def test_a_reshape_that_only_moves_unit_axes_becomes_a_transpose():
    before = dense_as_1x1_convs()
    after, report = normalize(before)
    assert report.applied["reshape-transpose"] == 2
    computed = ops(after)
    assert computed.count("Conv") == 2 and computed.count("Transpose") == 2
    layers = find_binary_layers(after)
    assert len(layers) == 2 and all(layer.binary and layer.strict for layer in layers)
    assert_exact(before, after, inputs(shape=ALEX))


@pytest.mark.slow
def test_alexnet_dense_layers_convert_to_lce_bconv2d(tmp_path):
    """A 1x1 conv on a 1x1 input is still a conv to LCE: both layers become LceBconv2d.

    Without the pass, `transpose-binarized` lifts the Reshape above the binarization and the
    translator keeps a reshape to [N, C, 1, 1] in NHWC storage itself, so both are binary too
    (the gate checks both); the pass's Transpose form saves the Reshape's shape constant."""
    x = inputs(shape=ALEX)
    result = convert(dense_as_1x1_convs(), tmp_path, x)
    assert result.binary_layers == 2 and result.lce_bconv2d == 2
    assert result.float_fallbacks == [] and result.normalized.applied["reshape-transpose"] == 2
    plain = convert(dense_as_1x1_convs(), tmp_path, x, disabled=("reshape-transpose",))
    assert plain.lce_bconv2d == 2 and plain.float_fallbacks == []
    assert "reshape-transpose" not in plain.normalized.applied
    assert result.lce_bytes <= plain.lce_bytes


@pytest.mark.parametrize(
    ("source", "target"),
    [((1, 2, 3, 1), (1, 1, 3, 2)), ((1, 2, 3, 1), (1, 6, 1, 1))],
    ids=["swaps-non-unit-axes", "merges-axes"],
)
def test_unit_perm_is_found_only_where_the_data_stays_in_order(source, target):
    from bnnexport.converters.normalize.layout import unit_perm

    assert unit_perm(list(source), list(target)) is None
    assert unit_perm([1, 1, 1, 9], [1, 9, 1, 1]) == [0, 3, 1, 2]
    x = np.arange(2 * 5 * 3).reshape(1, 2, 1, 5, 3)
    perm = unit_perm(list(x.shape), [2, 1, 5, 1, 3])
    np.testing.assert_array_equal(np.transpose(x, perm), x.reshape(2, 1, 5, 1, 3))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shape": [1, 2, 3, 6], "target": (-1, 6, 2, 3)},  # NHWC -> NCHW by reshape: reorders
        {"shape_input": True},  # the second target is only known at run time
    ],
    ids=["reorders-data", "dynamic-target"],
)
def test_a_reshape_that_reorders_or_is_not_known_stays(kwargs):
    before = dense_as_1x1_convs(**kwargs)
    after, report = normalize(before)
    expected = 0 if "shape" in kwargs else 1  # the first (constant) reshape still goes
    assert report.applied.get("reshape-transpose", 0) == expected
    assert ops(after).count("Transpose") == expected
    if "shape" in kwargs:
        assert_exact(before, after, inputs(shape=kwargs["shape"]))


SLOPE = np.array([0.25, -0.5, 0.0, 2.0], np.float32).reshape(1, 4, 1, 1)  # both signs, and 0


def keras_prelu(source="x", swap_add=False, swap_mul=False, neg_of="x", slope_input=False,
                slope=SLOPE):  # fmt: skip
    """Keras' PReLU as tf2onnx writes it: Add(Relu(x), Mul(Relu(Neg(x)), -alpha))."""
    mul_in = ["rn", "c"] if not swap_mul else ["c", "rn"]
    nodes = [
        helper.make_node("Relu", [source], ["r"]),
        helper.make_node("Neg", [neg_of], ["n"]),
        helper.make_node("Relu", ["n"], ["rn"]),
        helper.make_node("Mul", mul_in, ["m"]),
        helper.make_node("Add", ["m", "r"] if swap_add else ["r", "m"], ["y"]),
    ]
    if slope_input:  # c computed from the input: not a constant
        return [helper.make_node("Abs", ["x"], ["c"]), *nodes]
    return [const("c", -slope), *nodes]


@pytest.mark.parametrize("swap_add", [False, True])
@pytest.mark.parametrize("swap_mul", [False, True])
def test_keras_prelu_becomes_one_prelu_exactly(swap_add, swap_mul):
    before = model(keras_prelu(swap_add=swap_add, swap_mul=swap_mul))
    after, report = normalize(before)
    assert ops(after) == ["PRelu"] and report.applied["keras-prelu"] == 1
    assert_exact(before, after, inputs())


@pytest.mark.parametrize(
    "kwargs",
    [{"neg_of": "x2"}, {"slope_input": True}],
    ids=["neg-of-another-tensor", "slope-not-constant"],
)
def test_a_relu_sum_that_is_not_a_prelu_stays(kwargs):
    nodes = keras_prelu(**kwargs)
    if kwargs.get("neg_of") == "x2":
        nodes = [helper.make_node("Abs", ["x"], ["x2"]), *nodes]
    after, report = normalize(model(nodes))
    assert "PRelu" not in ops(after) and "keras-prelu" not in report.applied


@pytest.mark.slow
def test_keras_prelu_after_a_binary_conv_converts_to_one_prelu_op(tmp_path):
    binarize = [const("zero", np.float32(0)), const("one", np.float32(1)),
                const("minus", np.float32(-1)),
                helper.make_node("GreaterOrEqual", ["x", "zero"], ["ge"]),
                helper.make_node("Where", ["ge", "one", "minus"], ["b"])]  # fmt: skip
    conv = with_conv(binarize, "b")
    conv[-1].output[0] = "conv"
    net = model([*conv, *keras_prelu("conv", neg_of="conv", slope=SLOPE[:, :3])])
    fused = convert(net, tmp_path, inputs())
    assert fused.lce_bconv2d == 1 and fused.normalized.applied["keras-prelu"] == 1
    assert fused.op_histogram.get("PRELU") == 1 and "NEG" not in fused.op_histogram
    plain = convert(net, tmp_path, inputs(), disabled=("keras-prelu",))
    assert "PRELU" not in plain.op_histogram and plain.op_histogram.get("NEG") == 1


def test_index_put_on_uninitialised_memory_is_canonical():
    """`out = x.new(x.size()); out[x >= 0] = 1; out[x < 0] = -1`: the legacy exporter stores
    whatever memory `x.new` returned as the base constant; every value is overwritten, so each
    distinct value is probed and the chain is still the canonical binarization."""
    garbage = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32) * 1e30
    garbage.reshape(-1)[::5] = np.nan
    nodes = [
        const("zero", np.float32(0)), const("one", np.float32(1)), const("minus", np.float32(-1)),
        const("garbage", garbage),
        helper.make_node("GreaterOrEqual", ["x", "zero"], ["ge"]),
        helper.make_node("Where", ["ge", "one", "garbage"], ["put1"]),
        helper.make_node("Less", ["x", "zero"], ["lt"]),
        helper.make_node("Where", ["lt", "minus", "put1"], ["b"]),
    ]  # fmt: skip
    before = model(with_conv(nodes, "b"))
    after, report = normalize(before)
    assert ops(after) == [*CANONICAL, "Conv"] and report.applied["where-compare"] == 1
    assert_exact(before, after, inputs())


def test_a_function_whose_value_depends_on_a_nonuniform_constant_is_not_a_sign():
    # only x >= 0 is overwritten: below 0 the output is the constant's value, position by position
    varying = np.where(np.arange(100).reshape(SHAPE) % 2 == 0, -1.0, -2.0).astype(np.float32)
    nodes = [
        const("zero", np.float32(0)), const("one", np.float32(1)), const("varying", varying),
        helper.make_node("GreaterOrEqual", ["x", "zero"], ["ge"]),
        helper.make_node("Where", ["ge", "one", "varying"], ["b"]),
    ]  # fmt: skip
    after, report = normalize(model(with_conv(nodes, "b")))
    assert "where-compare" not in report.applied and "Where" in ops(after)


def test_a_plain_sign_of_a_hardtanh_is_checked_for_zeros_at_the_clamps_input():
    """Classic BinaryNet code: hardtanh, then a plain Sign. `clamp-sign` makes the binarization
    read x and drops the Clip, so the zero-free check must name x (the Clip's output is gone)."""
    nodes = [
        const("lo", np.float32(-1.0)), const("hi", np.float32(1.0)),
        helper.make_node("Clip", ["x", "lo", "hi"], ["c"]),
        helper.make_node("Sign", ["c"], ["b"]),
    ]  # fmt: skip
    before = model(with_conv(nodes, "b"))
    after, report = normalize(before)
    assert report.applied["clamp-sign"] == 1 and "Clip" not in ops(after)
    assert report.zero_sensitive == {"x": 0.0}


def test_the_pipeline_names_every_registered_pass_once():
    """PIPELINE is the one statement of order: every pass users can name (the classifier's
    labels run as its one step) and every other step is in it, once."""
    from bnnexport.converters.normalize import PIPELINE, SIGN_IDIOMS, STEPS

    assert len(set(PIPELINE)) == len(PIPELINE)
    assert set(PIPELINE) == (set(REWRITES) - set(SIGN_IDIOMS)) | set(STEPS)


def test_a_pass_that_builds_an_invalid_graph_is_named_in_one_line(monkeypatch):
    from bnnexport.converters.errors import InvalidModelError

    def broken(work) -> int:  # drops the node producing the graph's output
        if not any(n.op_type == "Conv" for n in work.nodes):
            return 0
        work.nodes = [n for n in work.nodes if n.op_type != "Conv"]
        return 1

    monkeypatch.setitem(REWRITES, "transpose-sink", broken)
    nodes = [
        helper.make_node("Sign", ["x"], ["s0"]),
        const("c", np.float32(0.1)),
        helper.make_node("Add", ["s0", "c"], ["a"]),
        helper.make_node("Sign", ["a"], ["b"]),
    ]
    valid = model(with_conv(nodes, "b"), out_shape=[1, 3, 5, 5])
    with pytest.raises(InvalidModelError) as error:
        normalize(valid)
    message = str(error.value)
    assert "\n" not in message and "pass transpose-sink produced an invalid ONNX graph" in message
