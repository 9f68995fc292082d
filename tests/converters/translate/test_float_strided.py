"""Float (non-binary) strided convs with symmetric torch padding convert exactly.

LCE 0.16 rewrites an explicit zero Pad + strided VALID conv into a SAME conv whenever the
output size is ceil(size / stride) and the pads split like SAME's, without checking the
total: torch's (1, 1) on an even size became TF's (0, 1) (docs/LCE_NOTES.md "Binary ops", bug 1; max
|diff| ~3-4 on first layers such as ResNet's 7x7/2 pad 3). The translator must keep these float
convs exact and still emit them as float CONV_2D.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from support.converter_nets import binary_conv, convert_net, sign

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("seeded"),
]  # each test runs TensorFlow's and LCE's converters

TIGHT = 1e-4  # max |diff| vs torch, as a fraction of the logit range


class FloatStridedNet(nn.Module):
    """float strided conv -> binarize -> ±1 conv -> flatten -> float head."""

    def __init__(self, k, s, p, size, depthwise=False):
        super().__init__()
        cin = 8 if depthwise else 3
        self.pre = nn.Conv2d(3, 8, 1) if depthwise else nn.Identity()
        groups = 8 if depthwise else 1
        self.first = nn.Conv2d(cin, 8, k, stride=s, padding=p, groups=groups)
        out = [(d + 2 * p - k) // s + 1 for d in size]
        self.binary = binary_conv(8, 16, 3, padding=1)
        self.head = nn.Linear(16 * out[0] * out[1], 10)

    def forward(self, x):
        x = self.first(self.pre(x))
        return self.head(torch.flatten(self.binary(sign(x)), 1))


def _check(result, versus_torch, float_convs):
    assert result.gate("ONNX Runtime").plain_argmax_agreement == 1.0
    assert versus_torch.argmax_agreement == 1.0
    assert versus_torch.max_abs_diff <= TIGHT * max(versus_torch.logit_range, 1.0)
    assert result.lce_bconv2d == 1, result.op_histogram
    assert result.float_conv2d == float_convs, result.op_histogram


KSP = [(3, 2, 1), (7, 2, 3), (5, 2, 2), (11, 4, 4)]


@pytest.mark.parametrize("size", [(16, 16), (17, 17), (32, 32), (16, 17)])
@pytest.mark.parametrize("ksp", KSP, ids=lambda v: "k{}s{}p{}".format(*v))
def test_float_strided_padded_conv_is_exact(tmp_path, ksp, size):
    k, s, p = ksp
    result, versus_torch = convert_net(FloatStridedNet(k, s, p, size), (1, 3, *size), tmp_path)
    _check(result, versus_torch, 1)


@pytest.mark.parametrize("size", [(16, 16), (15, 18)])
def test_float_strided_depthwise_conv_is_exact(tmp_path, size):
    net = FloatStridedNet(3, 2, 1, size, depthwise=True)
    result, versus_torch = convert_net(net, (1, 3, *size), tmp_path)
    _check(result, versus_torch, 2)


@pytest.mark.parametrize("size", [(16, 16), (13, 14)])
def test_float_conv_padding_wider_than_read(tmp_path, size):
    # stride 3, pad 2 on both sides: torch never reads some trailing pad rows/cols
    net = FloatStridedNet(3, 3, 2, size)
    result, versus_torch = convert_net(net, (1, 3, *size), tmp_path)
    _check(result, versus_torch, 1)


def test_flattened_nhwc_output_is_reordered_without_gather(tmp_path):
    # a flattened feature map as the model output: torch's NCHW column order is restored by
    # transpose + reshape, not a GATHER with one index per feature
    class Features(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.binary = binary_conv(8, 16, 3, padding=1)

        def forward(self, x):
            return torch.flatten(self.binary(sign(self.first(x))), 1)

    result, versus_torch = convert_net(Features(), (1, 3, 16, 16), tmp_path)
    _check(result, versus_torch, 1)
    assert "GATHER" not in result.op_histogram, result.op_histogram
