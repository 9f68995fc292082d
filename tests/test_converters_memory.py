"""converters.lce frees each conversion's TensorFlow state before the next converter runs
(docs/LCE_NOTES.md §9): the traced graph of a large model sits in reference cycles that only a
garbage collection frees, so without it every conversion starts on top of the last one's."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn as nn
from converter_nets import BinaryBlock, convert_net

import converters.lce as lce_module
import converters.onnx_to_tf as onnx_to_tf
from converters.lce import release_memory


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
        release_memory(lce_module.RELEASE_ABOVE_BYTES - 1)  # a small model: nothing collected
        assert dead() is not None
        release_memory(lce_module.RELEASE_ABOVE_BYTES)
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
    monkeypatch.setattr(lce_module, "RELEASE_ABOVE_BYTES", 0)  # this small net counts as large
    gc.disable()  # a collection between the stages would hide a missing release_memory
    try:
        result, _ = convert_net(Net(), (1, 3, 8, 8), tmp_path)
    finally:
        gc.enable()
    assert result.lce_bconv2d == 1
    assert len(alive_at_convert) >= 2  # the model and its exact-grid twin
    assert alive_at_convert == [0] * len(alive_at_convert)
    assert lce_module.release_memory is release_memory
