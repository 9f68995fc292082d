"""bnnexport.converters.patterns: which ONNX layers are binary, and what their kernels hold."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from bnnexport.converters.patterns import GREATER_OR_EQUAL_WHERE, SIGN_ADD_SIGN, find_binary_layers
from support.converter_nets import binary_conv


def _onnx_of(module: nn.Module, shape: tuple[int, ...], **kwargs) -> onnx.ModelProto:
    buffer = io.BytesIO()
    torch.onnx.export(module.eval(), torch.randn(*shape), buffer, dynamo=False, **kwargs)
    return onnx.load_from_string(buffer.getvalue())


class SignNet(nn.Module):
    def __init__(self, binarize: str = "sign", pad_value: float | None = 1.0):
        super().__init__()
        self.first = nn.Conv2d(1, 4, 3)
        self.conv = binary_conv(4, 6)
        self.binarize = binarize
        self.pad_value = pad_value

    def forward(self, x):
        x = self.first(x)
        if self.binarize == "sign":
            x = torch.sign(torch.sign(x) + 0.1)
        else:
            x = torch.where(x >= 0, 1.0, -1.0)
        if self.pad_value is not None:
            x = F.pad(x, (1, 1, 1, 1), value=self.pad_value)
        return self.conv(x)


def test_sign_add_sign_through_one_padding_is_a_strict_binary_conv():
    layers = find_binary_layers(_onnx_of(SignNet("sign"), (1, 1, 8, 8)))
    assert [(m.op_type, m.pattern, m.strict) for m in layers] == [("Conv", SIGN_ADD_SIGN, True)]
    assert set(np.unique(np.abs(layers[0].kernel))) == {1.0}
    assert layers[0].scale is None


def test_greater_or_equal_where_is_recognised():
    layers = find_binary_layers(_onnx_of(SignNet("where", pad_value=None), (1, 1, 8, 8)))
    assert [(m.op_type, m.pattern) for m in layers] == [("Conv", GREATER_OR_EQUAL_WHERE)]


def test_first_float_conv_is_not_a_binary_layer():
    layers = find_binary_layers(_onnx_of(SignNet("sign"), (1, 1, 8, 8)))
    assert all(m.node_name != "/first/Conv" for m in layers)


def test_folded_batchnorm_gives_a_per_channel_scale():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = binary_conv(3, 5)
            self.bn = nn.BatchNorm2d(5)
            with torch.no_grad():
                self.bn.weight.copy_(torch.tensor([0.5, 2.0, 1.0, 3.0, 0.25]))

        def forward(self, x):
            return self.bn(self.conv(torch.sign(torch.sign(x) + 0.1)))

    (layer,) = find_binary_layers(_onnx_of(Net(), (1, 3, 6, 6)))
    assert not layer.strict and layer.binary
    assert layer.scale is not None and layer.scale.shape == (5,)
    np.testing.assert_allclose(layer.scale, [0.5, 2.0, 1.0, 3.0, 0.25], rtol=1e-4)


def test_non_binary_kernel_is_reported_with_offending_values():
    net = SignNet("sign")
    with torch.no_grad():
        net.conv.weight[0, 0, 0, 0] = 0.5
        net.conv.weight[1, 1, 1, 1] = 0.25
    (layer,) = find_binary_layers(_onnx_of(net, (1, 1, 8, 8)))
    assert not layer.binary
    assert layer.num_off == 2
    assert layer.off_examples[0] == ((0, 0, 0, 0), 0.5)


def test_binary_dense_after_flatten_is_a_matmul_with_output_axis_last():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 7, bias=False)
            with torch.no_grad():
                self.fc.weight.copy_(torch.where(torch.randn(7, 12) >= 0, 1.0, -1.0))

        def forward(self, x):
            return self.fc(torch.flatten(torch.sign(torch.sign(x) + 0.1), 1))

    (layer,) = find_binary_layers(_onnx_of(Net(), (1, 3, 2, 2)))
    assert layer.op_type in ("MatMul", "Gemm") and layer.strict
    assert layer.kernel.shape[layer.out_axis] == 7


def test_plain_sign_is_not_a_binarization():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = binary_conv(2, 2)

        def forward(self, x):
            return self.conv(torch.sign(x))  # sign(0) = 0: not ±1

    assert find_binary_layers(_onnx_of(Net(), (1, 2, 5, 5))) == []


@pytest.mark.parametrize("opset", [13, 17])
def test_patterns_found_at_supported_opsets(opset):
    layers = find_binary_layers(_onnx_of(SignNet("where"), (1, 1, 8, 8), opset_version=opset))
    assert len(layers) == 1
