"""bnnexport.converters.lce: torch BNNs -> ONNX -> LCE flatbuffer, every binary layer an LceBconv2d,
outputs equal to PyTorch's (checked in LCE's interpreter against ONNX Runtime and torch)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from support.converter_nets import (
    BinaryBlock,
    binary_conv,
    binary_linear,
    convert_net,
    sign,
    trained_bn,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("seeded"),
]  # each test runs TensorFlow's and LCE's converters


TIGHT = 1e-4  # max |diff| vs torch; logits here are O(10-100)


def _assert_exact_binary(result, versus_torch, binary_layers):
    assert result.binary_layers == binary_layers
    assert result.lce_bconv2d == binary_layers, result.op_histogram
    assert result.gate("ONNX Runtime").plain_argmax_agreement == 1.0
    assert versus_torch.argmax_agreement == 1.0
    assert versus_torch.max_abs_diff <= TIGHT * max(versus_torch.logit_range, 1.0)


class Stack(nn.Module):
    def __init__(self, padding, stride, size, cin=32, width=32):
        super().__init__()
        out = [(d - 1) // stride + 1 for d in size]
        self.first = nn.Conv2d(3, cin, 3, padding=1)
        self.a = BinaryBlock(cin, width, stride=stride, padding=padding)
        self.b = BinaryBlock(width, width, stride=1, padding=padding)
        self.head = nn.Linear(width * out[0] * out[1], 10)

    def forward(self, x):
        return self.head(torch.flatten(self.b(self.a(self.first(x))), 1))


@pytest.mark.parametrize("padding", ["one", "zero"])
@pytest.mark.parametrize("stride", [1, 2])
def test_padded_binary_convs_are_exact_and_binary_on_even_sizes(tmp_path, padding, stride):
    result, torch_check = convert_net(Stack(padding, stride, (12, 12)), (1, 3, 12, 12), tmp_path)
    _assert_exact_binary(result, torch_check, 2)
    if padding == "one" and stride == 1:
        # SAME one-padding: the first bconv writes packed bits for the second, so the only
        # LceQuantize is the one after the float stem (zero padding's output stays float)
        assert result.op_histogram.get("LceQuantize") == 1, result.op_histogram


@pytest.mark.parametrize("padding", ["one", "zero"])
def test_odd_spatial_sizes_with_stride_2(tmp_path, padding):
    result, torch_check = convert_net(Stack(padding, 2, (11, 9)), (1, 3, 11, 9), tmp_path)
    _assert_exact_binary(result, torch_check, 2)


def test_channel_counts_not_multiples_of_32(tmp_path):
    result, torch_check = convert_net(
        Stack("one", 2, (10, 10), cin=5, width=13), (1, 3, 10, 10), tmp_path
    )
    _assert_exact_binary(result, torch_check, 2)


def test_max_pool_after_binary_conv_runs_on_packed_bits(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(1, 32, 3, padding=1)
            self.a = BinaryBlock(32, 32, pool=True)
            self.b = BinaryBlock(32, 16)

        def forward(self, x):
            return self.b(self.a(self.first(x))).mean((2, 3))

    result, torch_check = convert_net(Net(), (1, 1, 12, 12), tmp_path)
    _assert_exact_binary(result, torch_check, 2)
    assert result.op_histogram.get("LceBMaxPool2d") == 1


def test_per_channel_scaled_kernel_from_folded_batchnorm(tmp_path):
    # the default export folds BatchNorm into the conv: kernels become ±1 x scale
    from bnnexport.converters.patterns import find_binary_layers

    result, torch_check = convert_net(Stack("one", 1, (8, 8)), (1, 3, 8, 8), tmp_path)
    import onnx

    layers = find_binary_layers(onnx.load(tmp_path / "net.onnx"))
    assert all(layer.scale is not None for layer in layers)
    _assert_exact_binary(result, torch_check, 2)


def test_binary_dense_layers_become_1x1_bconvs_after_nchw_flatten(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(3, 8, 3)
            self.fc1 = binary_linear(8 * 5 * 6, 24)
            self.bn = trained_bn(nn.BatchNorm1d(24))
            self.fc2 = binary_linear(24, 10, bias=True)

        def forward(self, x):
            x = torch.flatten(sign(self.first(x)), 1)  # NCHW order: the converter runs NHWC
            return self.fc2(sign(self.bn(self.fc1(x))))

    result, torch_check = convert_net(Net(), (1, 3, 7, 8), tmp_path)
    _assert_exact_binary(result, torch_check, 2)
    assert result.fully_connected == 0


def test_residual_add_between_binary_blocks(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(3, 16, 3, padding=1)
            self.a = BinaryBlock(16, 16)
            self.b = BinaryBlock(16, 16)

        def forward(self, x):
            x = self.first(x)
            x = x + self.a(x)
            x = x + self.b(x)
            return x.mean((2, 3))

    result, torch_check = convert_net(Net(), (1, 3, 9, 9), tmp_path)
    _assert_exact_binary(result, torch_check, 2)


def test_average_pooling_and_prelu(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(3, 16, 3, padding=1)
            self.a = BinaryBlock(16, 16)
            self.act = nn.PReLU(16)
            with torch.no_grad():
                self.act.weight.copy_(torch.linspace(-0.5, 0.5, 16))
            self.head = nn.Linear(16 * 3 * 3, 10)

        def forward(self, x):
            x = self.act(self.a(self.first(x)))
            x = F.avg_pool2d(x, 3, stride=2, padding=1)
            return self.head(torch.flatten(x, 1))

    result, torch_check = convert_net(Net(), (1, 3, 6, 6), tmp_path)
    _assert_exact_binary(result, torch_check, 1)
    # one fused op, as LCE's native converter gives Keras' PReLU (docs/LCE_NOTES.md "PReLU fusion")
    assert result.op_histogram.get("PRELU") == 1, result.op_histogram
    assert "NEG" not in result.op_histogram and "RELU" not in result.op_histogram


class GatedBlock(nn.Module):
    """Real-to-Binary Net's block: x + BN(bconv(sign x)) * sigmoid(fc(relu(fc(mean x)))),
    the gate broadcast back with `[:, :, None, None]` (two Unsqueeze nodes)."""

    def __init__(self, channels: int, seed: int):
        super().__init__()
        self.block = BinaryBlock(channels, channels)
        self.squeeze = nn.Linear(channels, channels // 2)
        self.expand = nn.Linear(channels // 2, channels)
        with torch.no_grad():  # gates spread over (0, 1), not all near 0.5
            g = torch.Generator().manual_seed(seed)
            self.expand.weight.copy_(torch.randn(channels, channels // 2, generator=g) * 2)

    def forward(self, x):
        gate = torch.sigmoid(self.expand(F.relu(self.squeeze(x.mean((2, 3))))))
        return x + self.block(x) * gate[:, :, None, None]


def test_real_to_binary_sigmoid_gates_convert_with_their_twin_gates_at_one_half(tmp_path):
    """Every binary conv an LceBconv2d; the exact-grid twin zeroes each gate's last linear
    layer (`converters.gate.twin.zeroed_feeds`), so it compares the runtimes without rounding."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(3, 32, 3, padding=1)
            self.blocks = nn.Sequential(*[GatedBlock(32, seed) for seed in range(4)])
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            return self.head(self.blocks(self.first(x)).mean((2, 3)))

    torch.manual_seed(0)
    result, torch_check = convert_net(Net(), (1, 3, 8, 8), tmp_path)
    assert result.lce_bconv2d == result.binary_layers == 4, result.op_histogram
    assert result.op_histogram.get("LOGISTIC") == 4
    assert result.twin and all(r.plain_argmax_agreement == 1.0 for r in result.twin)
    assert torch_check.argmax_agreement == 1.0


def test_hardtanh_clip_and_global_average_pool(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(3, 16, 3)
            self.a = BinaryBlock(16, 8, padding="zero")

        def forward(self, x):
            x = F.hardtanh(self.first(x))
            return F.adaptive_avg_pool2d(self.a(x), 1).flatten(1)

    result, torch_check = convert_net(Net(), (1, 3, 8, 8), tmp_path)
    _assert_exact_binary(result, torch_check, 1)


def test_exact_zero_accumulators_under_negative_multipliers_convert_exactly(tmp_path):
    """Fresh BatchNorm (mean 0, beta 0), an even fan-in and negative multipliers: many
    pre-activations are exactly 0 or -0.0, and the flatbuffer still binarizes them like torch.

    This scenario passes even with `tie_break_bias` disabled (LCE adds the fused bias, +0.0,
    after the multiplier here, which clears the sign bit); what guards the tie-break itself is
    `translate/test_values.py` (every integer accumulator, in NumPy) and the BinaryNet mutation
    test in `test_binarynet.py` (convert exits 1 without it)."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = binary_conv(4, 16, 1)
            self.bn = nn.BatchNorm2d(16)
            with torch.no_grad():
                self.bn.weight[::2] = -1.0  # negative multipliers: 0 x (-m) is -0.0
            self.b = binary_conv(16, 8, 1)

        def forward(self, x):
            x = self.bn(self.a(sign(x)))
            return F.max_pool2d(self.b(sign(F.max_pool2d(x, 2))), 2).flatten(1)

    # keep BatchNorm separate: folded into the kernel, ORT's rounding decides the ties
    result, torch_check = convert_net(Net(), (1, 4, 8, 8), tmp_path, do_constant_folding=False)
    _assert_exact_binary(result, torch_check, 2)


def test_where_binarization_converts_like_sign(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(3, 32, 3)
            self.conv = binary_conv(32, 8)

        def forward(self, x):
            x = torch.where(self.first(x) >= 0, 1.0, -1.0)
            return self.conv(F.pad(x, (1, 1, 1, 1), value=1.0)).flatten(1)

    result, torch_check = convert_net(Net(), (1, 3, 8, 8), tmp_path)
    _assert_exact_binary(result, torch_check, 1)


@pytest.mark.parametrize(
    "pads, value, stride",
    [
        ((1, 1, 1, 1), 0.0, 2),  # explicit zero F.pad before a strided conv
        ((1, 1, 1, 1), -1.0, 1),  # minus-one padding
        ((1, 0, 1, 0), 1.0, 1),  # asymmetric one-padding (not TF's SAME)
    ],
)
def test_explicit_pads_before_a_binary_conv_are_exact(tmp_path, pads, value, stride):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(3, 32, 3)
            self.conv = binary_conv(32, 8, 2 if pads == (1, 0, 1, 0) else 3, stride=stride)

        def forward(self, x):
            x = F.pad(sign(self.first(x)), pads, value=value)
            return self.conv(x).flatten(1)

    result, torch_check = convert_net(Net(), (1, 3, 10, 10), tmp_path)
    _assert_exact_binary(result, torch_check, 1)


@pytest.mark.parametrize("size, stride", [(1, 1), (2, 1), (2, 2)])
def test_zero_padded_binary_conv_on_inputs_smaller_than_the_kernel(tmp_path, size, stride):
    # LCE's own SAME zero-padding correction is wrong here; the converter must not use it
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(3, 32, 1)
            self.block = BinaryBlock(32, 16, stride=stride, padding="zero")

        def forward(self, x):
            return self.block(self.first(x)).flatten(1)

    result, torch_check = convert_net(Net(), (1, 3, size, size), tmp_path)
    _assert_exact_binary(result, torch_check, 1)


def test_relu_then_batchnorm_after_a_binary_conv_quicknet_style(tmp_path):
    # LCE fuses the ReLU into the bconv, then folds the BatchNorm into its multiplier and bias
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(3, 32, 3, padding=1)
            self.conv = binary_conv(32, 32)
            self.bn = trained_bn(nn.BatchNorm2d(32))

        def forward(self, x):
            x = self.first(x)
            y = self.conv(F.pad(sign(x), (1, 1, 1, 1), value=1.0))
            return (x + self.bn(F.relu(y))).mean((2, 3))

    result, torch_check = convert_net(Net(), (1, 3, 8, 8), tmp_path)
    _assert_exact_binary(result, torch_check, 1)


def test_the_exact_grid_twin_alone_catches_a_translation_bug(tmp_path, monkeypatch):
    """Zero-padded stride-2 binary convs need a correction map; with it zeroed the twin's LCE
    flatbuffer differs from ONNX Runtime's twin, whatever the real weights would show."""
    import bnnexport.converters.translate.tf_layers
    import onnx
    from bnnexport.converters.errors import ConversionMismatchError
    from bnnexport.converters.gate import GateOptions
    from bnnexport.converters.gate.checks import check_twin
    from support.converter_nets import export, grid_inputs

    path = export(Stack("zero", 2, (12, 12)), (1, 3, 12, 12), tmp_path / "net.onnx")
    model, x = onnx.load(str(path)), grid_inputs(8, (1, 3, 12, 12))
    assert all(r.max_abs_diff == 0.0 for r in check_twin(model, x, [], GateOptions()))
    real = bnnexport.converters.translate.tf_layers.correction_map
    monkeypatch.setattr(
        bnnexport.converters.translate.tf_layers, "correction_map", lambda *a: real(*a) * 0.0
    )
    with pytest.raises(ConversionMismatchError, match="LCE twin vs ONNX Runtime twin"):
        check_twin(model, x, [], GateOptions())


class DeadChannels(nn.Module):
    """QuickNet's bconv -> ReLU -> BatchNorm, one-padded, with every fourth channel one that
    never fires: its ±1 kernel is all -1 and every input is +1 (the stem's weights are 0, its
    bias 1), so its accumulator is -288 everywhere, and its BatchNorm statistics say so (mean
    and variance 0: multiplier gamma/sqrt(eps) = 316; output exactly beta)."""

    DEAD = slice(None, None, 4)

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 32, 3, padding=1)
        self.conv = binary_conv(32, 32)
        self.bn = trained_bn(nn.BatchNorm2d(32))
        with torch.no_grad():
            self.first.weight.zero_()
            self.first.bias.fill_(1.0)
            self.conv.weight[self.DEAD] = -1.0
            self.bn.running_mean[self.DEAD] = 0.0
            self.bn.running_var[self.DEAD] = 0.0
            self.bn.bias[self.DEAD] = torch.linspace(-0.01, 0.01, 8)

    def forward(self, x):
        x = self.first(x)
        y = self.conv(F.pad(sign(x), (1, 1, 1, 1), value=1.0))
        return (x + self.bn(F.relu(y))).mean((2, 3))


def test_a_batchnorm_with_zero_variance_after_a_relu_of_a_binary_conv_converts_exactly(tmp_path):
    """LCE folds a BatchNorm after a bconv (and a ReLU) into its output transform as K*m + b in
    float32; with m = 316 and K = 288 that rounds b (-0.01..0.01) to a multiple of 2^-7
    (docs/LCE_NOTES.md "Binary ops"). Such an affine map is applied after the bconv instead,
    and the channels that never fire come out as torch computes them: 1 + beta."""
    import numpy as np
    from bnnexport.converters.gate import compare_outputs
    from bnnexport.converters.lce import convert_onnx
    from bnnexport.converters.runtimes import run_lce
    from support.converter_nets import export

    net = DeadChannels().eval()
    path = export(net, (1, 3, 4, 4), tmp_path / "net.onnx")
    x = np.random.default_rng(0).standard_normal((16, 3, 4, 4)).astype(np.float32)
    with torch.no_grad():
        expected = net(torch.from_numpy(x)).numpy()
    result = convert_onnx(path, tmp_path / "net.tflite", inputs=x)
    got = run_lce(result.output, x)
    _assert_exact_binary(result, compare_outputs(expected, got), 1)
    dead = np.abs(got - expected)[:, DeadChannels.DEAD]
    assert dead.max() <= 1e-6, dead.max(axis=0)


def test_folding_the_dead_channels_batchnorm_into_lce_is_refused(tmp_path, monkeypatch):
    """The mutant a refactor could bring back: every affine map folded into LCE's bconv,
    whatever K*|m|. LCE then rounds the dead channels' bias away (up to 2^-8 here), and the
    gate refuses the flatbuffer."""
    import bnnexport.converters.translate.values
    import numpy as np
    from bnnexport.converters.errors import ConversionMismatchError
    from bnnexport.converters.lce import convert_onnx
    from support.converter_nets import export

    path = export(DeadChannels().eval(), (1, 3, 4, 4), tmp_path / "net.onnx")
    x = np.random.default_rng(0).standard_normal((16, 3, 4, 4)).astype(np.float32)
    monkeypatch.setattr(bnnexport.converters.translate.values, "FOLD_LIMIT", float("inf"))
    with pytest.raises(ConversionMismatchError, match="LCE vs ONNX Runtime"):
        convert_onnx(path, tmp_path / "net.tflite", inputs=x)
    assert not (tmp_path / "net.tflite").exists()
