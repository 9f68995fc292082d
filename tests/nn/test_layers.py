"""Binary layers: the weight is the ±1 kernel; one- and zero-padding; discovery by type."""

import torch
import torch.nn.functional as F
from torch import nn

from bnnexport.models import create_model
from bnnexport.nn.layers import BinaryConv2d, BinaryLinear, binary_parameters, set_latent


def is_strictly_binary(t: torch.Tensor) -> bool:
    return bool(((t == 1) | (t == -1)).all())


def test_new_layers_hold_strictly_binary_kernels():
    assert is_strictly_binary(BinaryConv2d(32, 16, 3).weight)
    assert is_strictly_binary(BinaryLinear(64, 8).weight)


def test_one_padding_pads_the_binarized_input_with_plus_one():
    conv = BinaryConv2d(2, 3, 3, padding=1, pad_value="one")
    x = torch.randn(1, 2, 5, 5)
    expected = F.conv2d(F.pad(torch.where(x >= 0, 1.0, -1.0), (1, 1, 1, 1), value=1.0), conv.weight)
    assert torch.equal(conv(x), expected)


def test_zero_padding_is_torchs_usual_padding_after_the_sign():
    conv = BinaryConv2d(2, 3, 3, stride=2, padding=1, pad_value="zero")
    x = torch.randn(1, 2, 6, 6)
    expected = F.conv2d(torch.where(x >= 0, 1.0, -1.0), conv.weight, stride=2, padding=1)
    assert torch.equal(conv(x), expected)


def test_first_layer_without_input_quantizer_sees_real_inputs():
    conv = BinaryConv2d(1, 4, 3, input_quantizer=None)
    x = torch.randn(1, 1, 5, 5)
    assert torch.allclose(conv(x), F.conv2d(x, conv.weight))


def test_binary_parameters_are_found_by_layer_type_not_name():
    model = nn.Sequential(nn.Conv2d(1, 32, 3), BinaryConv2d(32, 8, 3), nn.Flatten())
    model.add_module("binary_looking_name", nn.Linear(3, 3))
    params = binary_parameters(model)
    assert len(params) == 1 and params[0] is model[1].weight


def test_leaving_latent_mode_binarizes_weights_in_place():
    model = create_model("mnist-bnn")
    set_latent(model, True)
    for p in binary_parameters(model):
        p.data.uniform_(-1, 1)
        p.data.view(-1)[0] = 0.0
    set_latent(model, False)
    for p in binary_parameters(model):
        assert is_strictly_binary(p)
        assert p.view(-1)[0] == 1.0  # sign(0) = +1


def test_latent_weights_start_small_so_they_can_flip():
    from bnnexport.nn.layers import init_latent_weights

    model = create_model("mnist-bnn")
    init_latent_weights(model)
    for p in binary_parameters(model):
        assert 0 < p.abs().max() < 0.5
        assert (p > 0).any() and (p < 0).any()
