"""Translator mutants: one-line mistakes a refactor of the translator could plausibly make.

Each is installed with monkeypatch, shown to change the flatbuffer's outputs on a model it
touches (so the test cannot pass on a mutant that changes nothing), and must be refused by the
conversion gate with no flatbuffer kept. Parameters and inputs are on exact grids
(`converter_nets.snap_to_grid`), so the unmutated models convert exactly and a refusal cannot
depend on rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import bnnexport.converters.translate.onnx_to_tf as onnx_to_tf
import bnnexport.converters.translate.tf_elementwise as tf_elementwise
import bnnexport.converters.translate.tf_layers as tf_layers
import bnnexport.converters.translate.tf_quantized as tf_quantized
import numpy as np
import pytest
import torch
import torch.nn as nn
from bnnexport.converters.errors import ConversionMismatchError
from bnnexport.converters.translate.values import Layout, Value
from support.converter_nets import (
    BinaryBlock,
    FloatStemBinaryBody,
    binary_conv,
    binary_linear,
    export,
    grid_inputs,
    sign,
    snap_to_grid,
    trained_bn,
)

pytestmark = [pytest.mark.slow, pytest.mark.long]  # two conversions each: ~15-30 s apiece
SHAPE = (1, 3, 12, 12)  # square: a mutant swapping H and W keeps every shape


class Padded(nn.Module):
    """float stem -> one-padded binary block -> zero-padded stride-2 block (correction map)
    -> flatten -> ±1 dense: padding, kernels, BatchNorm and flatten order all matter."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 32, 3, padding=1)
        self.bn0 = trained_bn(nn.BatchNorm2d(32), seed=1)
        self.a = BinaryBlock(32, 32, padding="one")
        self.b = BinaryBlock(32, 32, stride=2, padding="zero")
        self.head = binary_linear(32 * 6 * 6, 10)

    def forward(self, x):
        x = self.b(self.a(self.bn0(self.first(x))))
        return self.head(sign(torch.flatten(x, 1)))


class Biased(nn.Module):
    """A zero-padded binary conv with its own bias, and a binary conv dilated by 2."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 32, 3, padding=1)
        self.bn0 = trained_bn(nn.BatchNorm2d(32), seed=1)
        self.conv = binary_conv(32, 32, 3, padding=1, bias=True)
        with torch.no_grad():
            self.conv.bias.copy_(torch.randint(-8, 9, (32,)).float())
        self.dilated = binary_conv(32, 32, 3, dilation=2, padding=2)
        self.bn = trained_bn(nn.BatchNorm2d(32), seed=2)
        self.head = nn.Linear(32 * 12 * 12, 10)

    def forward(self, x):
        x = self.bn0(self.first(x))
        x = x + self.conv(sign(x))
        x = self.bn(self.dilated(sign(x)))
        return self.head(torch.flatten(x, 1))


class Branches(nn.Module):
    """Two binary branches of different widths concatenated along channels."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 32, 3, padding=1)
        self.bn0 = trained_bn(nn.BatchNorm2d(32), seed=1)
        self.a = BinaryBlock(32, 32, padding="one")
        self.b = BinaryBlock(32, 64, padding="one", kernel=1)
        self.c = BinaryBlock(96, 32, padding="one")
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.bn0(self.first(x))
        x = self.c(torch.cat([self.a(x), self.b(x)], 1))
        return self.head(x.mean((2, 3)))


def _negated_fill(real: Callable) -> Callable:
    return lambda x, pads, value: real(x, pads, -value)


def _flipped_kernel(real: Callable) -> Callable:
    return lambda signs: real(np.ascontiguousarray(signs[::-1, ::-1]))


def _flatten_in_stored_order(real: Callable) -> Callable:
    def flat(x: Value) -> Value:
        out = real(x)
        return Value(out.stored, Layout.LOGICAL) if out.layout == Layout.PERMUTED_COLUMNS else out

    return flat


def _reversed_concat(real: Callable) -> Callable:
    return lambda tr, node, inputs: real(tr, _reordered(node), inputs[::-1])


def _reordered(node):
    copy = type(node)()
    copy.CopyFrom(node)
    copy.input[:] = list(node.input)[::-1]
    return copy


def _undilated(real: Callable) -> Callable:
    def call(self, t, padding):
        return real(tf_layers._BinaryConv(self.k_hwio, self.strides, [1, 1]), t, padding)

    return call


def _negated_bias(real: Callable) -> Callable:
    return lambda tr, node, channels: -real(tr, node, channels)


def _mean_added(real: Callable) -> Callable:
    """BatchNorm folded as beta + mean * m: the sign of the mean's term lost."""

    def batch_norm(tr, node, inputs):
        mean = tr.const(node.input[3])
        swapped = type(node)()
        swapped.CopyFrom(node)
        return _with_const(tr, node.input[3], -mean, lambda: real(tr, swapped, inputs))

    return batch_norm


def _with_const(tr, name: str, value: np.ndarray, run: Callable):
    real = tr.const
    tr.const = lambda n: value if n == name else real(n)
    try:
        return run()
    finally:
        tr.const = real


class _SwappedTranspose:
    """numpy for tf_layers, but an OIHW -> HWIO kernel transpose comes out WHIO."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def transpose(self, a, axes=None):
        swapped = (3, 2, 1, 0) if tuple(axes or ()) == (2, 3, 1, 0) else axes
        return self.real.transpose(a, swapped)


def _negated_correction(real: Callable) -> Callable:
    return lambda *args: -real(*args)


MUTANTS = {
    # name: (model, module, attribute or handler, mutation)
    "padding fill negated": (Padded, tf_layers, "pad_constant", _negated_fill),
    "kernel rotated 180 degrees": (Padded, tf_layers, "sign_kernel", _flipped_kernel),
    "flatten in NHWC order": (Padded, tf_elementwise, "_to_flat", _flatten_in_stored_order),
    "BatchNorm mean sign": (Padded, onnx_to_tf.HANDLERS, "BatchNormalization", _mean_added),
    "OIHW->HWIO transpose swaps H and W": (Padded, tf_layers, "np", _SwappedTranspose),
    "correction map negated": (Padded, tf_layers, "correction_map", _negated_correction),
    "conv bias negated": (Biased, tf_layers, "_conv_bias", _negated_bias),
    "dilation dropped": (Biased, tf_layers._BinaryConv, "__call__", _undilated),
    "concat order reversed": (Branches, onnx_to_tf.HANDLERS, "Concat", _reversed_concat),
}


UNFOLDED = {"BatchNorm mean sign"}


def _install(monkeypatch, where, name: str, mutation: Callable) -> None:
    if isinstance(where, dict):
        monkeypatch.setitem(where, name, mutation(where[name]))
    else:
        monkeypatch.setattr(where, name, mutation(getattr(where, name)))


def _mutant_outputs(path: Path, x: np.ndarray) -> np.ndarray:
    """The flatbuffer the translator writes now (the gate not run) on `x`."""
    from bnnexport.converters.graph import load_onnx
    from bnnexport.converters.normalize import normalize
    from bnnexport.converters.runtimes import run_lce
    from bnnexport.converters.translate import translate

    model, _ = normalize(load_onnx(path))
    flatbuffer = translate(model, float_model=False).flatbuffer
    return run_lce(flatbuffer, x)


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_a_translator_mutant_changes_the_flatbuffer_and_is_refused(tmp_path, monkeypatch, mutant):
    from bnnexport.converters.lce import convert_onnx
    from bnnexport.converters.runtimes import run_onnx

    net, where, name, mutation = MUTANTS[mutant]
    torch.manual_seed(0)
    path = export(snap_to_grid(net()), SHAPE, tmp_path / "net.onnx")
    x = grid_inputs(8, SHAPE)
    if mutant in UNFOLDED:  # else torch's exporter folds BatchNorm into the conv weights
        path = export(snap_to_grid(net()), SHAPE, path, do_constant_folding=False)
    _install(monkeypatch, where, name, mutation)
    expected = run_onnx(path, x)
    wrong = np.abs(_mutant_outputs(path, x) - expected).max()
    assert wrong > 1e-3 * (expected.max() - expected.min()), "the mutant changes nothing here"
    with pytest.raises(ConversionMismatchError) as refused:
        convert_onnx(path, tmp_path / "net.tflite", inputs=x)
    assert not (tmp_path / "net.tflite").exists()
    print(f"\n{mutant} ({net.__name__}, max |diff| {wrong:.3g}): {refused.value}")


@pytest.mark.parametrize("net", [Padded, Biased, Branches])
def test_the_unmutated_models_convert_exactly(tmp_path, net):
    from bnnexport.converters.lce import convert_onnx

    torch.manual_seed(0)
    path = export(snap_to_grid(net()), SHAPE, tmp_path / "net.onnx")
    result = convert_onnx(path, tmp_path / "net.tflite", inputs=grid_inputs(8, SHAPE))
    assert result.lce_bconv2d == result.binary_layers >= 2, result.op_histogram
    assert result.gate("ONNX Runtime").plain_argmax_agreement == 1.0


# -- the int8 path (converters.quantize, translate.tf_quantized, gate.quantized) ------------


def _zero_point_negated(real: Callable) -> Callable:
    return lambda scale, zero: real(scale, -np.asarray(zero))


def _range_a_step_wider(real: Callable) -> Callable:
    def wider(scale, zero):
        low, high = real(scale, zero)
        return low - scale, high  # 257 steps squeezed into 256: another scale

    return wider


def _dense_in_stored_column_order(real: Callable) -> Callable:
    def dense(tr, node, inputs):
        x = inputs[0]
        if x is not None and x.layout == Layout.PERMUTED_COLUMNS:
            x = Value(x.stored, Layout.LOGICAL)
        return real(tr, node, [x, *inputs[1:]])

    return dense


INT8_MUTANTS = {
    "int8 zero point negated": (tf_quantized, "quantized_range", _zero_point_negated),
    "int8 range a step wider": (tf_quantized, "quantized_range", _range_a_step_wider),
    "int8 dense reads stored columns": (onnx_to_tf.HANDLERS, "Gemm", _dense_in_stored_column_order),
}
INT8_SHAPE = (1, 3, 8, 8)


def _int8_outputs(path: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the QDQ reference in ONNX Runtime, the flatbuffer the translator writes now) on `x`."""
    from bnnexport.converters.graph import load_onnx
    from bnnexport.converters.normalize import normalize
    from bnnexport.converters.quantize import quantize
    from bnnexport.converters.runtimes import run_lce, run_onnx
    from bnnexport.converters.translate import translate

    model, _ = normalize(load_onnx(path))
    quantized = quantize(model, x).model
    flatbuffer = translate(quantized, float_model=False).flatbuffer
    return run_onnx(quantized.SerializeToString(), x), run_lce(flatbuffer, x)


@pytest.mark.parametrize("mutant", list(INT8_MUTANTS))
def test_an_int8_translator_mutant_changes_the_flatbuffer_and_is_refused(
    tmp_path, monkeypatch, mutant
):
    from bnnexport.converters.lce import ConvertOptions, convert_onnx

    where, name, mutation = INT8_MUTANTS[mutant]
    torch.manual_seed(0)
    path = export(FloatStemBinaryBody(), INT8_SHAPE, tmp_path / "net.onnx",
                  do_constant_folding=False)  # fmt: skip
    x = np.random.default_rng(0).uniform(-1, 1, (16, *INT8_SHAPE[1:])).astype(np.float32)
    _install(monkeypatch, where, name, mutation)
    expected, mutated = _int8_outputs(path, x)
    wrong = np.abs(mutated - expected).max()
    assert wrong > 0.01 * (expected.max() - expected.min()), "the mutant changes nothing here"
    options = ConvertOptions(float_layers="int8", twin=False)
    with pytest.raises(ConversionMismatchError) as refused:
        convert_onnx(path, tmp_path / "net.tflite", inputs=x, options=options)
    assert not (tmp_path / "net.tflite").exists()
    print(f"\n{mutant} (max |diff| {wrong:.3g}): {refused.value}")
