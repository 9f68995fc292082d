"""ONNX graphs as tf2onnx 1.17 writes larq Keras BNNs, built with onnx.helper (larq, tf-keras
and tf2onnx cannot share bnnexport's venv: docs/LCE_NOTES.md "Dependency stack").

What tf2onnx writes for a larq model (docs/ARCHITECTURE.md, "What each exporter writes"): an
NHWC graph whose input has a dynamic batch and a TensorFlow name (`serving/input_1:0`);
`ste_sign` as Sign -> Add(0.1) -> Sign on the NHWC tensor; a Transpose to NCHW between every
binarization and its Conv, and one back after it; BatchNorm as Mul/Add on the last axis; Keras
Flatten/Reshape with a dynamic batch as Shape -> Gather -> Cast -> Slice -> Concat -> Reshape;
QuantDense as MatMul. `larq_like()` builds such a model: a float stem, two binary 3x3 convs and
a binary dense layer.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INPUT = "serving/input_1:0"


def _ones(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.where(rng.standard_normal(shape) >= 0, 1.0, -1.0).astype(np.float32)


def larq_like(
    size: int = 8, channels: int = 32, classes: int = 10, seed: int = 0, dense: bool = True
):
    """(model, input shape): NHWC, dynamic batch, as tf2onnx writes a small larq QuickNet."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=f"model/{name}", **attrs))
        return name

    def conv(x: str, kernel: np.ndarray, tag: str) -> str:  # NHWC in, NHWC out
        t = node("Transpose", [x], f"{tag}_nchw", perm=[0, 3, 1, 2])
        c = node("Conv", [t, init(f"{tag}_kernel", kernel)], f"{tag}_conv", pads=[1] * 4)
        return node("Transpose", [c], f"{tag}_nhwc", perm=[0, 2, 3, 1])

    def batch_norm(x: str, tag: str) -> str:
        m = init(f"{tag}_mul", (rng.random(channels) + 0.5).astype(np.float32))
        b = init(f"{tag}_add", (rng.standard_normal(channels) * 0.3).astype(np.float32))
        return node("Add", [node("Mul", [x, m], f"{tag}_m"), b], f"{tag}_bn")

    def ste_sign(x: str, tag: str) -> str:
        s = node("Sign", [x], f"{tag}_sign0")
        a = node("Add", [s, init(f"{tag}_point1", np.float32(0.1))], f"{tag}_add01")
        return node("Sign", [a], f"{tag}_sign")

    stem = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.5
    x = batch_norm(conv(INPUT, stem, "stem"), "bn0")
    for k in (1, 2):
        x = batch_norm(conv(ste_sign(x, f"q{k}"), _ones(rng, (channels, channels, 3, 3)),
                            f"bconv{k}"), f"bn{k}")  # fmt: skip
    if not dense:
        nodes.append(helper.make_node("Identity", [x], ["logits"]))
        classes = channels
    x = ste_sign(x, "q3") if dense else x
    shape = node("Shape", [x], "flat_shape")
    batch = node("Gather", [shape, init("zero", np.array([0], np.int64))], "flat_batch", axis=0)
    batch = node("Cast", [batch], "flat_batch_i64", to=TensorProto.INT64)
    batch = node("Slice", [batch, init("s0", np.array([0], np.int64)),
                           init("s1", np.array([1], np.int64))], "flat_n")  # fmt: skip
    target = node("Concat", [batch, init("minus1", np.array([-1], np.int64))], "flat_to", axis=0)
    flat = node("Reshape", [x, target], "flatten")
    if dense:
        kernel = _ones(rng, (size * size * channels, classes))
        nodes.append(helper.make_node("MatMul", [flat, init("dense_kernel", kernel)], ["logits"],
                                      name="model/dense"))  # fmt: skip
    graph = helper.make_graph(
        nodes, "larq_like",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["unk__0", size, size, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, (1, size, size, 3)
