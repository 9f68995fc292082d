"""k-bit activations (DoReFa-Net's 2-bit quantizer: Clip, Mul, Round, Div) convert exactly as
float ops, TFLite's ROUND rounding half to even as ONNX's Round and torch.round do; a conv with
a ±1 kernel on them stays a float conv, while the binary layer before them is an LceBconv2d
(docs/LCE_NOTES.md "k-bit activations")."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from support.converter_nets import BinaryBlock, convert_net, trained_bn

from bnnexport.nn.layers import BinaryConv2d

pytestmark = pytest.mark.slow  # TensorFlow's and LCE's converters


class BinaryThenTwoBit(nn.Module):
    """stem -> binary block -> BN -> 2-bit activations -> ±1 conv -> BN -> dense: DoReFa-Net's
    pattern after a binary layer (no sign follows the thirds, as in DoReFa-Net)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.block = BinaryBlock(32, 32)
        self.bn = trained_bn(nn.BatchNorm2d(32), seed=1)
        self.two_bit = BinaryConv2d(
            32, 16, 3, padding=1, pad_value="zero", input_quantizer="dorefa"
        )
        self.bn2 = trained_bn(nn.BatchNorm2d(16), seed=2)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        x = self.bn(self.block(self.stem(x)))
        return self.fc(torch.flatten(self.bn2(self.two_bit(x)), 1))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    torch.manual_seed(0)
    return convert_net(BinaryThenTwoBit().eval(), (1, 3, 8, 8), tmp_path_factory.mktemp("k"))


def test_two_bit_activations_convert_exactly_and_only_the_binary_layer_is_a_bconv(converted):
    result, versus_torch = converted
    assert result.lce_bconv2d == result.binary_layers == 1, result.op_histogram
    assert result.op_histogram["ROUND"] == 1 and result.op_histogram["CONV_2D"] == 2
    assert result.gate("ONNX Runtime").plain_argmax_agreement == 1.0
    assert versus_torch.argmax_agreement == 1.0
    assert versus_torch.max_abs_diff <= 1e-4 * max(versus_torch.logit_range, 1.0)


def test_the_quantizers_division_by_a_scalar_folds_into_the_next_conv(converted):
    """x * 3 -> Round -> / 3 -> conv: TFLite folds the scalar division into the conv's weights,
    as it does in LCE's native conversion of DoReFa-Net (docs/BENCHMARKS.md "Op parity"); a
    per-channel vector there stayed a MUL of its own."""
    result, _ = converted
    assert result.op_histogram["MUL"] == 1, result.op_histogram
