"""Translator ops no other converter test reaches: LeakyRelu, GlobalMaxPool, Softmax,
LogSoftmax (and a Dropout in eval mode, which the exporters drop or keep as a no-op), in one
small BNN through the legacy exporter and the whole gate (docs/LCE_NOTES.md "Coverage" lists which
test covers every op)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from support.converter_nets import BinaryBlock, convert_net

pytestmark = pytest.mark.slow  # TensorFlow's and LCE's converters


class RareOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.block = BinaryBlock(32, 32)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        y = F.leaky_relu(self.stem(x), 0.1)  # also read by a float path: a sign hides slopes
        pooled = torch.cat(
            [F.adaptive_max_pool2d(self.block(y), 1), F.adaptive_avg_pool2d(y, 1)], 1
        )
        logits = self.fc(self.drop(torch.flatten(pooled, 1)))
        return F.log_softmax(logits, 1) + F.softmax(logits, 1)


def test_rare_ops_convert_exactly(tmp_path):
    torch.manual_seed(0)
    result, versus_torch = convert_net(RareOps(), (1, 3, 8, 8), tmp_path)
    assert result.lce_bconv2d == result.binary_layers == 1, result.op_histogram
    assert result.gate("ONNX Runtime").plain_argmax_agreement == 1.0
    assert versus_torch.argmax_agreement == 1.0
    assert versus_torch.max_abs_diff <= 1e-4 * max(versus_torch.logit_range, 1.0)
    histogram = result.op_histogram
    assert {"LEAKY_RELU", "SOFTMAX", "LOG_SOFTMAX"} <= set(histogram), histogram


class Upsampling(nn.Module):
    """A float transposed conv (3x3/2, padded, with a bias) after a binary block."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.block = BinaryBlock(16, 16)
        self.up = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8 * 15 * 15, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.up(self.block(self.stem(x))), 1))


def test_a_float_transposed_conv_converts_exactly(tmp_path):
    torch.manual_seed(0)
    result, versus_torch = convert_net(Upsampling(), (1, 3, 8, 8), tmp_path)
    assert result.lce_bconv2d == result.binary_layers == 1, result.op_histogram
    assert result.op_histogram.get("TRANSPOSE_CONV") == 1, result.op_histogram
    assert versus_torch.argmax_agreement == 1.0
    assert versus_torch.max_abs_diff <= 1e-4 * max(versus_torch.logit_range, 1.0)
