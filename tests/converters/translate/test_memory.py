"""bnnexport.converters.translate (`onnx_to_tflite`) frees each conversion's TensorFlow state
before the next converter runs (docs/LCE_NOTES.md "Conversion memory"): the traced graph of a large
model sits in reference cycles that only a garbage collection frees, so without it every conversion
starts on top of the last one's."""

from __future__ import annotations

import gc
import weakref

import bnnexport.converters.translate.onnx_to_tf as onnx_to_tf
import bnnexport.converters.translate.onnx_to_tflite as onnx_to_tflite
import bnnexport.converters.translate.tf_layers as tf_layers
import bnnexport.converters.translate.tf_ops as tf_ops
import numpy as np
import pytest
import torch
import torch.nn as nn
from bnnexport.converters.graph import load_onnx
from bnnexport.converters.normalize import normalize
from bnnexport.converters.runtimes import run_lce, tf
from bnnexport.converters.translate import release_memory
from support.converter_nets import (
    BinaryBlock,
    binary_linear,
    convert_net,
    export,
    grid_inputs,
    sign,
)


class _Cycle:
    def __init__(self):
        self.me = self


def test_release_memory_collects_reference_cycles():
    gc.disable()  # only release_memory may collect here
    try:
        held = _Cycle()
        dead = weakref.ref(held)
        del held
        assert dead() is not None  # a cycle: reference counting alone does not free it
        release_memory(onnx_to_tflite.RELEASE_ABOVE_BYTES - 1)  # a small model: nothing collected
        assert dead() is not None
        release_memory(onnx_to_tflite.RELEASE_ABOVE_BYTES)
        assert dead() is None
    finally:
        gc.enable()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 32, 3, padding=1)
        self.block = BinaryBlock(32, 32)
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.block(self.first(x)), 1))


@pytest.mark.slow  # runs TensorFlow's and LCE's converters
def test_each_traced_graph_is_freed_before_a_converter_runs(tmp_path, monkeypatch):
    torch.manual_seed(0)
    traced: list[weakref.ref] = []
    build = onnx_to_tf.build_module

    def tracked(*args, **kwargs):
        module, info = build(*args, **kwargs)
        traced.append(weakref.ref(module.concrete.graph))  # holds the model's constants
        return module, info

    monkeypatch.setattr(onnx_to_tf, "build_module", tracked)
    import larq_compute_engine as lce

    convert = lce.convert_saved_model
    alive_at_convert: list[int] = []

    def checked(*args, **kwargs):
        alive_at_convert.append(sum(ref() is not None for ref in traced))
        return convert(*args, **kwargs)

    monkeypatch.setattr(lce, "convert_saved_model", checked)
    monkeypatch.setattr(onnx_to_tflite, "RELEASE_ABOVE_BYTES", 0)  # a small net counts as large
    gc.disable()  # a collection between the stages would hide a missing release_memory
    try:
        result, _ = convert_net(Net(), (1, 3, 8, 8), tmp_path)
    finally:
        gc.enable()
    assert result.lce_bconv2d == 1
    assert len(alive_at_convert) >= 2  # the model and its exact-grid twin
    assert alive_at_convert == [0] * len(alive_at_convert)


class DenseHeadNet(nn.Module):
    """A float stem, a binary conv block and a binary dense head: both kinds of sign kernel."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 32, 3, padding=1)
        self.block = BinaryBlock(32, 32)
        self.head = binary_linear(32 * 8 * 8, 10)

    def forward(self, x):
        return self.head(sign(torch.flatten(self.block(self.first(x)), 1)))


SIGN_KERNEL_ELEMENTS = 32 * 32 * 3 * 3 + 32 * 8 * 8 * 10


def _float_sign_kernel(signs):
    return tf().constant(np.asarray(signs, np.float32))


def _saved_model_bytes(onnx_path, directory) -> int:
    model, _ = normalize(load_onnx(onnx_path))
    onnx_to_tf.save_saved_model(model, directory)
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


@pytest.mark.slow  # traces and saves the model twice
def test_sign_kernels_are_saved_as_int8(tmp_path, monkeypatch):
    torch.manual_seed(0)
    onnx_path = export(DenseHeadNet(), (1, 3, 8, 8), tmp_path / "net.onnx")
    int8 = _saved_model_bytes(onnx_path, tmp_path / "int8")
    monkeypatch.setattr(tf_layers, "sign_kernel", _float_sign_kernel)
    as_float = _saved_model_bytes(onnx_path, tmp_path / "float")
    # 4 bytes per ±1 weight as float32 constants, 1 as int8: every copy the tracing, the
    # SavedModel and the converters' imports make shrinks by that much (docs/LCE_NOTES.md "int8
    # kernels")
    assert as_float - int8 >= 0.95 * 3 * SIGN_KERNEL_ELEMENTS


@pytest.mark.slow  # runs TensorFlow's and LCE's converters twice
def test_int8_sign_kernels_give_the_same_flatbuffer_as_float_ones(tmp_path, monkeypatch):
    torch.manual_seed(0)
    net = DenseHeadNet()
    (tmp_path / "int8").mkdir()
    (tmp_path / "float").mkdir()
    int8, _ = convert_net(net, (1, 3, 8, 8), tmp_path / "int8")
    monkeypatch.setattr(tf_layers, "sign_kernel", _float_sign_kernel)
    as_float, _ = convert_net(net, (1, 3, 8, 8), tmp_path / "float")
    assert int8.lce_bconv2d == as_float.lce_bconv2d == 2
    # the converters fold the cast: no CAST op and no int8 copy of the weights is left
    assert int8.op_histogram == as_float.op_histogram
    assert abs(int8.lce_bytes - as_float.lce_bytes) <= 64  # tensor names and constant order
    x = grid_inputs(16, (1, 3, 8, 8))
    assert np.array_equal(run_lce(int8.output, x), run_lce(as_float.output, x))


class FloatHeadNet(nn.Module):
    """A float stem, a binary conv block and a float dense head of 2048 x 10 weights: one
    kernel above `WeightStore.MIN_ELEMENTS` (the head), one below (the stem's 864)."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 32, 3, padding=1)
        self.block = BinaryBlock(32, 32)
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.block(self.first(x)), 1))


HEAD_WEIGHTS = 32 * 8 * 8 * 10


@pytest.mark.slow  # traces and saves a model
def test_large_float_kernels_are_saved_as_variables_not_in_the_graph(tmp_path):
    torch.manual_seed(0)
    model, _ = normalize(load_onnx(export(FloatHeadNet(), (1, 3, 8, 8), tmp_path / "net.onnx")))
    onnx_to_tf.save_saved_model(model, tmp_path / "saved")
    graph = (tmp_path / "saved" / "saved_model.pb").stat().st_size
    variables = sum(p.stat().st_size for p in (tmp_path / "saved" / "variables").rglob("*"))
    # the head's kernel in the binary variables files, not in the GraphDef LCE has to parse
    assert variables >= 4 * HEAD_WEIGHTS > graph, (variables, graph)


@pytest.mark.slow  # runs TensorFlow's and LCE's converters twice
def test_float_kernels_as_variables_give_the_same_flatbuffer_as_constants(tmp_path, monkeypatch):
    torch.manual_seed(0)
    net = FloatHeadNet()
    (tmp_path / "variables").mkdir()
    (tmp_path / "constants").mkdir()
    stored, _ = convert_net(net, (1, 3, 8, 8), tmp_path / "variables")
    monkeypatch.setattr(tf_ops.WeightStore, "MIN_ELEMENTS", 10**9)  # every kernel a constant
    constants, _ = convert_net(net, (1, 3, 8, 8), tmp_path / "constants")
    assert stored.op_histogram == constants.op_histogram
    assert abs(stored.lce_bytes - constants.lce_bytes) <= 256  # tensor names
    x = grid_inputs(16, (1, 3, 8, 8))
    assert np.array_equal(run_lce(stored.output, x), run_lce(constants.output, x))


def test_a_retrace_asking_for_its_weights_in_another_order_is_refused():
    store = tf_ops.WeightStore()
    first, second = np.ones((32, 32), np.float32), np.zeros((32, 32), np.float32)
    store.read(first)
    store.read(second)
    store.restart()
    with pytest.raises(RuntimeError, match="another order"):
        store.read(second)
