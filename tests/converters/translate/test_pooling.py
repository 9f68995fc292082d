"""Pooling with ceil_mode=1 (and AveragePool padding that TensorFlow's SAME cannot express)
converts exactly: `converters.translate.tf_layers.pool_windows` gives every output's window as
torch and ONNX Runtime read it, and the translator emits exactly those windows.

The NumPy check runs the windows against torch on a grid of geometries (no TensorFlow); the
conversions run a small hand-written BNN with every kind of ceil-mode pool that changes the
output size through both torch exporters, `bnnexport.convert_module` and the whole gate (ONNX
Runtime, the exact-grid twin), and compare the flatbuffer with PyTorch.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from bnnexport.converters.translate.tf_layers import pool_windows
from support.converter_nets import BinaryBlock, binary_conv, binary_linear, sign, trained_bn


def _pooled(x: np.ndarray, windows_h, windows_w, reduce) -> np.ndarray:
    """[H, W] -> the reduction of each (row window, column window) pair, zeros as padding."""
    pad_b = [max(-w[0][0], 0) for w in (windows_h, windows_w)]
    pad_a = [max(w[-1][1] - n, 0) for w, n in zip((windows_h, windows_w), x.shape, strict=True)]
    padded = np.pad(x, [(pad_b[0], pad_a[0]), (pad_b[1], pad_a[1])])
    out = np.zeros((len(windows_h), len(windows_w)))
    for (i, (r0, r1)), (j, (c0, c1)) in itertools.product(
        enumerate(windows_h), enumerate(windows_w)
    ):
        out[i, j] = reduce(padded[r0 + pad_b[0] : r1 + pad_b[0], c0 + pad_b[1] : c1 + pad_b[1]])
    return out


GEOMETRIES = [  # size, kernel, stride, pad
    (size, k, s, p)
    for size in (5, 6, 7, 8, 13, 14)
    for k, s, p in [(2, 2, 0), (3, 2, 0), (3, 2, 1), (3, 3, 0), (3, 3, 1), (2, 3, 1), (5, 3, 2)]
    if k <= size + 2 * p
]


@pytest.mark.parametrize("ceil", [True, False])
@pytest.mark.parametrize("include", [True, False])
def test_pool_windows_are_torchs_for_average_pooling(ceil, include):
    torch.manual_seed(0)
    x = torch.randn(1, 1, 14, 15, dtype=torch.float64)
    for size, k, s, p in GEOMETRIES:
        xs = x[..., :size, : size + 1]
        expected = F.avg_pool2d(xs, k, s, p, ceil_mode=ceil, count_include_pad=include)[0, 0]
        windows = [pool_windows(n, k, s, p, p, ceil, include and p > 0) for n in (size, size + 1)]
        got = _pooled(xs[0, 0].numpy(), *windows, np.mean)
        assert got.shape == tuple(expected.shape), (size, k, s, p)
        # atol: a window's mean near 0 differs from torch's in its last bits only (summing order)
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=str((size, k, s, p)))  # fmt: skip


@pytest.mark.parametrize("ceil", [True, False])
def test_pool_windows_are_torchs_for_max_pooling(ceil):
    torch.manual_seed(0)
    x = torch.randn(1, 1, 14, 15, dtype=torch.float64)
    for size, k, s, p in GEOMETRIES:
        if 2 * p > k:  # torch's own limit for max pooling
            continue
        xs = x[..., :size, : size + 1]
        expected = F.max_pool2d(xs, k, s, p, ceil_mode=ceil)[0, 0]
        windows = [pool_windows(n, k, s, p, p, ceil, False) for n in (size, size + 1)]
        got = _pooled(xs[0, 0].numpy(), *windows, np.max)
        np.testing.assert_array_equal(got, expected.numpy(), err_msg=str((size, k, s, p)))


class CeilPools(nn.Module):
    """Every ceil-mode pool below gives one more output row and column than floor mode would;
    one binary conv is max-pooled in ceil mode before the next binarization, and every branch
    reaches the logits through a binary dense layer and a float one (a binarization alone
    would not see an average's divisor)."""

    def __init__(self):
        super().__init__()
        self.stem13 = nn.Conv2d(3, 8, 3, padding=1)  # 13x13
        self.stem14 = nn.Conv2d(3, 32, 2, padding=1)  # 14x14
        self.pools13 = [
            nn.AvgPool2d(2, 2, ceil_mode=True),  # Bi-Real-Net's shortcut: last window 1 wide
            nn.AvgPool2d(3, 3, ceil_mode=True, count_include_pad=False),
        ]
        self.pools14 = [
            nn.AvgPool2d(3, 2, padding=1, ceil_mode=True),  # count_include_pad=True
            nn.AvgPool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.MaxPool2d(3, 2, padding=1, ceil_mode=True),
        ]
        self.binary = binary_conv(32, 16, 3, padding=1)
        self.bn = trained_bn(nn.BatchNorm2d(16))
        features = 8 * (49 + 25) + 32 * (64 + 64 + 49 + 64) + 16 * 49
        self.dense = binary_linear(features, 64)
        self.bn1 = trained_bn(nn.BatchNorm1d(64), seed=1)
        self.head = nn.Linear(64, 10)
        self.float_head = nn.Linear(features, 10)

    def forward(self, x):
        a, b = self.stem13(x), self.stem14(x)
        flat = [torch.flatten(p(a), 1) for p in self.pools13]
        flat += [torch.flatten(p(b), 1) for p in self.pools14]
        y = F.max_pool2d(self.bn(self.binary(sign(b))), 3, 2, ceil_mode=True)
        flat.append(torch.flatten(y, 1))
        features = torch.cat(flat, 1)
        return self.head(self.bn1(self.dense(sign(features)))) + self.float_head(features)


def test_ceil_mode_changes_every_output_size_of_the_test_net():
    net = CeilPools().eval()
    a, b = torch.zeros(1, 8, 13, 13), torch.zeros(1, 32, 14, 14)
    for pool, x in [*((p, a) for p in net.pools13), *((p, b) for p in net.pools14)]:
        pool.ceil_mode = False
        floor = pool(x).shape
        pool.ceil_mode = True
        assert pool(x).shape[2:] == (floor[2] + 1, floor[3] + 1), pool


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_ceil_mode_pooling_converts_exactly(tmp_path, exporter):
    from bnnexport import convert_module

    torch.manual_seed(0)
    report = convert_module(CeilPools(), torch.randn(1, 3, 13, 13), out=tmp_path / "n.tflite",
                            exporter=exporter)  # fmt: skip
    assert report.lce_bconv2d == report.binary_layers == 2, report.op_histogram
    assert report.argmax_agreement == 1.0 and report.torch_argmax_agreement == 1.0
    assert report.torch_max_abs_diff <= 1e-4 * 100, report.torch_max_abs_diff
    assert report.twin_checks and all(
        c["plain_argmax_agreement"] == 1.0 for c in report.twin_checks
    )


class CeilMaxPoolBetweenBinaryConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.a, self.b = BinaryBlock(32, 32), BinaryBlock(32, 32)

    def forward(self, x):  # 14x14: ceil mode gives 7x7 where floor mode gives 6x6
        return self.b(F.max_pool2d(self.a(self.stem(x)), 3, 2, ceil_mode=True)).mean((2, 3))


@pytest.mark.slow
def test_a_ceil_mode_max_pool_between_binary_convs_runs_on_packed_bits(tmp_path):
    from support.converter_nets import convert_net

    torch.manual_seed(0)
    result, versus_torch = convert_net(CeilMaxPoolBetweenBinaryConvs(), (1, 3, 14, 14), tmp_path)
    assert result.lce_bconv2d == result.binary_layers == 2, result.op_histogram
    assert result.op_histogram.get("LceBMaxPool2d") == 1, result.op_histogram
    assert versus_torch.argmax_agreement == 1.0
    assert result.twin and all(t.plain_argmax_agreement == 1.0 for t in result.twin)
