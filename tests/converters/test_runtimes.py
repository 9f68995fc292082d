"""bnnexport.converters.runtimes: one set of ONNX Runtime options for every caller, one-line
refusals."""

from __future__ import annotations

import os

import numpy as np
import pytest
from bnnexport.converters.errors import InvalidModelError
from bnnexport.converters.flatbuffer import read_flatbuffer
from bnnexport.converters.runtimes import (
    HARMLESS_LINES,
    RUNTIMES,
    open_model,
    ort_session,
    run_onnx,
    stderr_filtered,
)
from onnx import TensorProto, helper, numpy_helper


def _model(batch: int | str = 1) -> bytes:
    """y = x * 2 + 1 on [batch, 3]."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["m"]),
            helper.make_node("Add", ["m", "one"], ["y"]),
        ],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("threads", [1, 2])
def test_ort_session_runs_with_the_threads_asked_and_one_inter_op_thread(threads):
    options = ort_session(_model(), threads).get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (threads, 1)


def test_ort_session_without_optimization_turns_every_optimization_off():
    import onnxruntime as ort

    level = ort_session(_model(), optimize=False).get_session_options().graph_optimization_level
    assert level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert ort_session(_model()).get_session_options().graph_optimization_level != level


def test_a_scaled_binary_conv_keeps_its_exact_zeros():
    """ORT's ConvMulFusion would fold the scale into the ±1 kernel: the sums then round, and
    exact zeros (where sign(0) = +1 decides) become tiny signed values (SCALING_FUSIONS)."""
    rng = np.random.default_rng(0)
    signs = lambda shape: np.where(rng.standard_normal(shape) >= 0, 1.0, -1.0)  # noqa: E731
    kernel, x = signs((8, 16, 3, 3)).astype(np.float32), signs((1, 16, 6, 6)).astype(np.float32)
    scale = rng.uniform(0.05, 0.3, (8, 1, 1)).astype(np.float32)
    weights = [numpy_helper.from_array(kernel, "w"), numpy_helper.from_array(scale, "s")]
    conv = helper.make_node("Conv", ["x", "w"], ["c"])

    def model(nodes, out):
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 6, 6])],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], weights,
        )  # fmt: skip
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    sums = ort_session(model([conv], "c").SerializeToString()).run(None, {"x": x})[0]
    scaled = model([conv, helper.make_node("Mul", ["c", "s"], ["y"])], "y").SerializeToString()
    outputs = ort_session(scaled, 1).run(None, {"x": x})[0]
    assert (sums == 0).sum() > 0  # ±1 sums of 144 terms: exact in any order
    np.testing.assert_array_equal(outputs, sums * scale)


def test_run_onnx_takes_a_path_bytes_or_an_open_session_alike(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(_model("N"))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    expected = x * 2 + 1
    for model in (path, str(path), _model("N"), ort_session(path, 1)):
        np.testing.assert_array_equal(run_onnx(model, x), expected)


def test_run_onnx_runs_a_batch_one_model_sample_by_sample():
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(run_onnx(ort_session(_model(1), 1), x), x * 2 + 1)


def _affine_flatbuffer(batch: int) -> bytes:
    """y = x * 2 + 1 on [batch, 3] as a float TFLite flatbuffer (LCE's interpreter runs it too)."""
    from bnnexport.converters.runtimes import tf

    tensorflow = tf()

    class Affine(tensorflow.Module):
        @tensorflow.function(
            input_signature=[tensorflow.TensorSpec([batch, 3], tensorflow.float32)]
        )
        def __call__(self, x):
            return x * 2.0 + 1.0

    module = Affine()
    functions = [module.__call__.get_concrete_function()]
    return tensorflow.lite.TFLiteConverter.from_concrete_functions(functions, module).convert()


def _opened(kind: str, batch: int):
    model = _model(batch) if kind == "onnxruntime" else _affine_flatbuffer(batch)
    return open_model(kind, model, threads=1)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize(
    "kind", ["onnxruntime", *(pytest.param(k, marks=pytest.mark.slow) for k in RUNTIMES[1:])]
)
def test_a_runtime_model_runs_any_number_of_samples_in_chunks_of_its_batch(kind, batch):
    """5 samples on a model of batch 1 or 2: every chunk's output kept, the last chunk padded."""
    model = _opened(kind, batch)
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    assert (model.kind, model.batch) == (kind, batch)
    np.testing.assert_array_equal(model.run(x), x * 2 + 1)


@pytest.mark.parametrize(
    "kind", ["onnxruntime", *(pytest.param(k, marks=pytest.mark.slow) for k in RUNTIMES[1:])]
)
def test_run_one_is_one_call_on_a_batch_the_model_takes(kind):
    model = _opened(kind, 2)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(model.run_one(x), x * 2 + 1)


def test_a_batch_that_does_not_fit_the_model_is_one_line():
    from bnnexport.converters.errors import InputShapeError

    with pytest.raises(InputShapeError, match=r"do not fit ONNX model \(in memory\)"):
        open_model("onnxruntime", _model(1)).run(np.zeros((2, 4), np.float32))


def test_open_model_refuses_a_runtime_it_does_not_know():
    with pytest.raises(ValueError, match="onnxruntime, tflite, lce"):
        open_model("tensorrt", _model())


@pytest.mark.parametrize(
    ("model", "why"),
    [(b"not onnx", "cannot load (in memory)"), ("/nonexistent/m.onnx", "/nonexistent/m.onnx")],
)
def test_a_model_onnx_runtime_cannot_load_is_one_line(model, why):
    with pytest.raises(InvalidModelError, match="ONNX Runtime cannot load") as caught:
        ort_session(model)
    assert why in str(caught.value) and "\n" not in str(caught.value).strip()


def test_read_flatbuffer_refuses_what_is_not_one(tmp_path):
    with pytest.raises(InvalidModelError, match="no such flatbuffer"):
        read_flatbuffer(tmp_path / "missing.tflite")
    with pytest.raises(InvalidModelError, match="TFL3"):
        read_flatbuffer(_model())
    assert read_flatbuffer(b"\0\0\0\0TFL3rest") == b"\0\0\0\0TFL3rest"


def test_bench_scores_with_the_onnx_runtime_session_it_times(tmp_path, monkeypatch):
    import bnnexport.converters.runtimes

    from bnnexport.run.directory import RunDir
    from bnnexport.stages.bench.host import host_backends

    (tmp_path / "checkpoint.pt").write_bytes(b"")  # host_backends only checks it is there
    (tmp_path / "model.onnx").write_bytes(_model("N"))
    opened = []
    recorded = lambda *a, **k: opened.append((a, k)) or ort_session(*a, **k)  # noqa: E731
    monkeypatch.setattr(bnnexport.converters.runtimes, "ort_session", recorded)
    factories = {name: f for name, _, f in host_backends(RunDir(tmp_path), "arm64", threads=2)}
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    predict, call = factories["onnxruntime"](x[:1])
    np.testing.assert_array_equal(predict(x), x * 2 + 1)
    call()
    assert [(a, k.get("optimize", True)) for a, k in opened] == [
        ((tmp_path / "model.onnx", 2), True)
    ]


@pytest.mark.parametrize(
    ("backend", "kind"),
    [("onnxruntime", "onnxruntime"), ("tflite-float", "tflite"), ("lce", "lce")],
)
def test_bench_opens_each_runtime_by_open_model_and_times_its_batch_one_call(
    tmp_path, monkeypatch, backend, kind
):
    from types import SimpleNamespace

    import bnnexport.converters.runtimes

    from bnnexport.run.directory import RunDir
    from bnnexport.stages.bench.host import host_backends

    class Opened:
        session = SimpleNamespace(get_inputs=lambda: [SimpleNamespace(name="x")])

        def __init__(self, *how):
            self.how, self.timed = how, []

        def run(self, x):
            return x

        def feed(self, x):  # the batch in the model's input layout, made before the timing
            self.fed = x.copy()
            return self.fed

        def run_one(self, x):
            self.timed.append(x)

    opened = []
    monkeypatch.setattr(
        bnnexport.converters.runtimes,
        "open_model",
        lambda *how: opened.append(Opened(*how)) or opened[-1],
    )
    (tmp_path / "checkpoint.pt").write_bytes(b"")  # host_backends only checks it is there
    factories = {name: f for name, _, f in host_backends(RunDir(tmp_path), "arm64", threads=3)}
    x1 = np.ones((1, 3), np.float32)
    predict, call = factories[backend](x1)
    call()
    assert [model.how[0::2] for model in opened] == [(kind, 3)]
    assert predict == opened[0].run and opened[0].timed == [opened[0].fed]


XNNPACK_LINE = "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."


def _harmless(line: str) -> bool:
    return line in HARMLESS_LINES


def test_stderr_filtered_drops_the_xnnpack_line_and_writes_back_every_other(capfd):
    with stderr_filtered(_harmless):
        os.write(2, f"WARNING: before\n{XNNPACK_LINE}\nERROR: a real one\n".encode())
    assert capfd.readouterr().err == "WARNING: before\nERROR: a real one\n"


def test_stderr_filtered_writes_the_lines_back_when_the_block_raises(capfd):
    with pytest.raises(RuntimeError), stderr_filtered(_harmless):
        os.write(2, f"{XNNPACK_LINE}\nERROR: why it failed\n".encode())
        raise RuntimeError("creation failed")
    assert capfd.readouterr().err == "ERROR: why it failed\n"
