"""bnnexport.converters.batch: the batched copy of an ONNX model (and, on a real run, of its
flatbuffer)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from bnnexport.converters.batch import HardCodedBatchError, batched_path, rebatch, rebatch_onnx
from bnnexport.converters.runtimes import run_onnx
from onnx import TensorProto, helper, numpy_helper

SHAPE = [1, 2, 3, 3]


def _model(nodes, initializers=(), out_shape=(1, 18)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _inputs(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal([n, *SHAPE[1:]]).astype(np.float32)


def _dims(value_info) -> list:
    return [d.dim_value or d.dim_param for d in value_info.type.tensor_type.shape.dim]


def test_flatten_model_runs_at_batch_n_like_at_batch_1(tmp_path):
    weights = numpy_helper.from_array(np.arange(18 * 4, dtype=np.float32).reshape(18, 4), "w")
    model = _model(
        [helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["y"])],
        [weights],
        (1, 4),
    )
    onnx.save(model, tmp_path / "m.onnx")
    copy = rebatch_onnx(tmp_path / "m.onnx", tmp_path / "m-b8.onnx", 8, _inputs(11))
    loaded = onnx.load(str(copy))
    assert _dims(loaded.graph.input[0]) == [8, 2, 3, 3]
    inputs = _inputs(11)  # not a multiple of 8: the last chunk is padded by run_onnx
    np.testing.assert_allclose(
        run_onnx(copy, inputs), run_onnx(tmp_path / "m.onnx", inputs), rtol=1e-6
    )


def test_reshape_to_a_constant_batch_1_is_refused_by_name():
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    model = _model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="/head/Reshape")], [shape]
    )
    with pytest.raises(
        HardCodedBatchError, match=r"/head/Reshape \(Reshape\) hard-codes batch 1"
    ) as info:
        rebatch(model, 4)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


def test_batch_free_reshape_is_accepted():
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "shape")  # 0: keep the batch
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"])], [shape])
    assert _dims(rebatch(model, 4).graph.input[0])[0] == 4


def test_output_fixed_at_batch_1_is_refused():
    starts, ends, axes = (
        numpy_helper.from_array(np.array([v], np.int64), n)
        for v, n in ((0, "s"), (1, "e"), (0, "a"))
    )
    model = _model(
        [helper.make_node("Slice", ["x", "s", "e", "a"], ["y"])], [starts, ends, axes], (1, 2, 3, 3)
    )
    with pytest.raises(HardCodedBatchError, match="output y keeps batch 1 when the input takes 4"):
        rebatch(model, 4)


def test_graph_that_mixes_samples_is_refused(tmp_path):
    model = _model(
        [
            helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
            helper.make_node("Sub", ["x", "m"], ["y"]),
        ],
        out_shape=SHAPE,
    )
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(HardCodedBatchError, match="the graph mixes samples"):
        rebatch_onnx(tmp_path / "m.onnx", tmp_path / "m-b4.onnx", 4, _inputs(8))


def test_a_batch_1_reshape_the_name_check_cannot_see_is_refused_by_running_it(tmp_path):
    """A dynamic batch and a target [1, -1] computed by a Concat, not a constant: only running
    it shows that the copy merges samples. The reference is the model as a batch-1 conversion
    sees it (each sample alone: 18 values), not the dynamic model run on all samples at once,
    which merges them the same way the copy does."""
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    rest = numpy_helper.from_array(np.array([-1], np.int64), "rest")
    model = _model(
        [
            helper.make_node("Concat", ["one", "rest"], ["shape"], axis=0),
            helper.make_node("Reshape", ["x", "shape"], ["y"]),
        ],
        [one, rest],
    )
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(HardCodedBatchError, match="outputs of another shape than at batch 1"):
        rebatch_onnx(tmp_path / "m.onnx", tmp_path / "m-b4.onnx", 4, _inputs(4))


def test_the_batched_copy_is_named_after_the_batch_1_file():
    assert batched_path("runs/x/model-arm64.tflite", 64).name == "model-arm64-b64.tflite"


@pytest.mark.slow
def test_convert_run_writes_a_gated_batched_copy(trained_run):
    from bnnexport.converters.flatbuffer import input_layout
    from bnnexport.converters.runtimes import lce_interpreter, run_lce

    from bnnexport.stages.convert import convert_run
    from bnnexport.stages.export import export_onnx

    export_onnx(trained_run, samples=40)
    report = convert_run(trained_run, samples=40, batched_copy=16)
    copy = trained_run / "model-arm64-b16.tflite"
    assert report.batched_copy["output"] == str(copy) and copy.is_file()
    # NHWC, as the batch-1 flatbuffer it copies declares (arm64's default input layout)
    assert list(lce_interpreter(copy).input_shapes[0]) == [16, 28, 28, 1]
    assert input_layout(copy) == input_layout(trained_run / "model-arm64.tflite") == "nhwc"
    assert report.batched_copy["argmax_agreement"] == 1.0 and report.batched_copy["samples"] == 40
    with np.load(trained_run / "samples.npz") as data:
        inputs = data["inputs"][:40].astype(np.float32)
    single = run_lce(trained_run / "model-arm64.tflite", inputs)
    np.testing.assert_allclose(run_lce(copy, inputs), single, atol=1e-4 * np.ptp(single))


def _negate_a_binary_kernel_at_batch(batch: int, translate):
    """`translate` that, for a graph taking `batch` samples, first negates one output channel
    of the first ±1 kernel: a translator wrong only at that batch."""

    def wrong(model, **kwargs):
        if model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == batch:
            model = onnx.ModelProto.FromString(model.SerializeToString())
            for init in model.graph.initializer:
                kernel = numpy_helper.to_array(init)
                if kernel.ndim == 4 and set(np.unique(kernel)) <= {-1.0, 1.0}:
                    kernel = kernel.copy()
                    kernel[0] *= -1
                    init.CopyFrom(numpy_helper.from_array(kernel, init.name))
                    break
            else:
                raise AssertionError("no ±1 kernel to break")
        return translate(model, **kwargs)

    return wrong


@pytest.mark.slow
def test_a_flatbuffer_wrong_only_at_batch_n_is_refused(tmp_path, monkeypatch):
    """`convert --batch N` runs the whole gate at batch N: a translation that is right at
    batch 1 and wrong at batch 2 writes nothing."""
    import bnnexport.converters.lce
    from support.cli import invoke
    from support.converter_nets import StemAndBinaryConv, export

    net, shape = StemAndBinaryConv(), (1, 2, 7, 7)
    onnx_path = export(net, shape, tmp_path / "dyn.onnx", dynamic_axes={"x": {0: "n"}},
                       input_names=["x"])  # fmt: skip
    assert invoke("convert", str(onnx_path), "--batch", "2").exit_code == 0
    (tmp_path / "dyn-arm64-b2.tflite").unlink()
    broken = _negate_a_binary_kernel_at_batch(2, bnnexport.converters.lce.translate)
    monkeypatch.setattr(bnnexport.converters.lce, "translate", broken)
    assert invoke("convert", str(onnx_path)).exit_code == 0  # batch 1 is untouched
    result = invoke("convert", str(onnx_path), "--batch", "2")
    assert result.exit_code == 1, result.output
    assert not (tmp_path / "dyn-arm64-b2.tflite").exists()
