"""The one discovery of binary kernels (`bnnexport.nn.discover`): from one forward pass PyTorch runs
itself, on every model the suite has, without the ONNX exporter; and the record it writes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support import own_models
from support.handwritten_bnn import KERNELS as HANDWRITTEN
from support.handwritten_bnn import hand_written_bnn
from support.own_models import sign
from torch import nn

from bnnexport.errors import CheckpointError, ConfigError, InputShapeError, NoBinaryKernelError
from bnnexport.models import create_model, list_models
from bnnexport.nn.discover import BinaryKernels, find_binary_kernels, select_binary, trace_layers
from bnnexport.nn.layers import BinaryConv2d, binary_layers, set_precision

MNIST = torch.randn(1, 1, 28, 28, generator=torch.Generator().manual_seed(0))
SMALL = {"binarynet": (3, 32, 32), "mnist-bnn": (1, 28, 28)}  # the rest at 3x64x64


@pytest.mark.parametrize("name", list_models())
def test_on_every_zoo_model_the_trace_finds_exactly_the_binary_layers(name):
    model = create_model(name, input_shape=SMALL.get(name, (3, 64, 64)))
    record = find_binary_kernels(model)
    assert record.found_by == "tracing"
    assert record.names == [f"{layer}.weight" for layer, _ in binary_layers(model)]
    # a BinaryConv2d on the image, or on DoReFa-Net's 2-bit activations: not binarized
    real_input = [not k.binary_input for k in record]
    quantizers = [m.input_quantizer for _, m in binary_layers(model)]
    assert real_input == [q is None or q.precision > 1 for q in quantizers]


@pytest.mark.parametrize("factory", sorted(own_models.KERNELS))
def test_on_hand_written_models_the_trace_finds_their_kernels(factory):
    model = getattr(own_models, factory)()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    record = find_binary_kernels(model, MNIST)
    assert record.names == own_models.KERNELS[factory]
    assert all(k.binary_input for k in record)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the model is left alone


def test_binarized_in_forward_and_used_as_it_is_are_told_apart():
    detach = find_binary_kernels(own_models.latent_detach_bnn(), MNIST)
    as_is = find_binary_kernels(own_models.plus_minus_one_bnn(), MNIST)
    custom_ste = find_binary_kernels(hand_written_bnn(), MNIST)
    assert [k.binarized for k in detach] == [True, True]  # (sign(w) - w).detach() + w
    assert [k.binarized for k in as_is] == [False, False, False]  # ±1 parameters, x @ w.t()
    assert custom_ste.names == HANDWRITTEN and all(k.binarized for k in custom_ste)


def test_a_scaled_kernel_through_the_detach_trick_is_binarized_despite_its_rounding(monkeypatch):
    """XNOR-Net's mean|w| x sign(w) through the detach trick, (a - w).detach() + w, is a·sign(w)
    only up to the rounding of (a - w) + w: the trace must still see a binarized kernel."""
    import bnnexport.nn.discover as discover

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(64, 64, 3, 3) * 0.3)

        def forward(self, x):  # the scale mean|w| / sqrt(fan_in), fan_in = 64 x 3 x 3
            scaled = self.w.abs().mean((1, 2, 3), keepdim=True) / 24 * sign(self.w)
            return F.conv2d(sign(x), (scaled - self.w).detach() + self.w)

    x = torch.randn(1, 64, 6, 6)
    assert [k.binarized for k in find_binary_kernels(Net(), x)] == [True]
    monkeypatch.setattr(discover, "ROUNDING", 0.0)
    assert [k.binarized for k in find_binary_kernels(Net(), x)] == [False]  # "computed"


def test_a_weight_outside_autograds_graph_is_tied_by_its_signs():
    class Net(nn.Module):  # where(w >= 0, 1, -1) carries no gradient back to w
        def __init__(self):
            super().__init__()
            self.stem, self.w = nn.Conv2d(1, 8, 3), nn.Parameter(torch.randn(8, 8, 3, 3))

        def forward(self, x):
            return F.conv2d(sign(self.stem(x)), sign(self.w)).mean((2, 3))

    assert find_binary_kernels(Net(), torch.randn(1, 1, 8, 8)).names == ["w"]


def test_zero_padding_after_the_sign_still_counts_as_a_binarized_input():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(sign(torch.randn(4, 4, 3, 3)))

        def forward(self, x):
            return F.conv2d(F.pad(sign(x), (1, 2, 1, 0)), self.w)  # zeros on three borders

    record = find_binary_kernels(Net(), torch.randn(1, 4, 6, 6))
    assert [(k.name, k.binary_input) for k in record] == [("w", True)]


def test_a_binary_transposed_conv_is_in_the_record_with_its_macs():
    from support.refused_models import Upsampling

    record = find_binary_kernels(Upsampling(), torch.randn(1, 1, 8, 8))
    kernel = next(k for k in record if k.name == "up.weight")
    assert (kernel.binarized, kernel.binary_input) == (True, True)
    assert kernel.layer == "up: conv_transpose2d" and kernel.shape == (16, 16, 2, 2)
    call = next(c for c in trace_layers(Upsampling(), torch.randn(1, 1, 8, 8)).calls
                if c.weight == "up.weight")  # fmt: skip
    assert call.macs == 16 * 4 * 4 * 16 * 2 * 2  # each input value meets out x kh x kw taps


def test_a_float_model_has_no_binary_kernel_and_says_how_to_name_them():
    float_net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 26 * 26, 2))
    with pytest.raises(NoBinaryKernelError, match="found by tracing.*binary=\\[...\\]"):
        find_binary_kernels(float_net, MNIST)


def test_a_kernel_computed_from_two_parameters_of_its_size_asks_for_binary():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.randn(4, 4, 3, 3))
            self.b = nn.Parameter(torch.randn(4, 4, 3, 3))

        def forward(self, x):  # an STE over a sum: both reach the kernel through autograd
            return F.conv2d(sign(x), own_models.detach_sign(self.a + self.b))

    with pytest.raises(ConfigError, match="computed from a and b: name the binary kernels"):
        find_binary_kernels(Net(), torch.randn(1, 4, 6, 6))
    named = find_binary_kernels(Net(), torch.randn(1, 4, 6, 6), binary=["a"])
    assert named.names == ["a"] and named.found_by == "named"


def test_named_kernels_take_globs_and_refuse_a_name_the_model_lacks():
    model = own_models.latent_detach_bnn()
    assert select_binary(model, ["blocks.?.weight"]) == own_models.KERNELS["latent_detach_bnn"]
    with pytest.raises(ConfigError, match="has no parameter 'blocks.9.weight'"):
        select_binary(model, ["blocks.0.weight", "blocks.9.weight"])


def test_a_model_that_cannot_take_the_input_is_one_line():
    with pytest.raises(InputShapeError) as error:
        find_binary_kernels(own_models.three_channel_bnn(), MNIST)
    message = str(error.value)
    assert "\n" not in message and "cannot take an input of shape [1, 1, 28, 28]" in message
    assert "to have 3 channels" in message


class Raising(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 1, 3, 3))

    def forward(self, x):
        x = F.conv2d(x, sign(self.w))
        raise RuntimeError("boom")  # the model's own bug


def test_an_error_the_models_own_code_raises_is_the_models_not_the_inputs():
    from bnnexport.errors import ModelCodeError

    with pytest.raises(ModelCodeError) as error:
        find_binary_kernels(Raising(), MNIST)
    line = Raising.forward.__code__.co_firstlineno + 2
    message = str(error.value)
    assert message.startswith("Raising's own code raised RuntimeError: boom (")
    assert f"test_discover.py:{line}, in forward): an error in the model, not in" in message


def test_discovery_never_calls_the_onnx_exporter(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the exporter was called")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    assert find_binary_kernels(own_models.unexportable_bnn(), MNIST).names == ["weight"]


def test_a_bf16_product_does_not_hide_a_layer_from_the_trace():
    """set_precision('bf16-exact') computes BinaryConv2d without F.conv2d: the trace runs the
    float32 form, so the record does not depend on the precision."""
    model = create_model("mnist-bnn")
    set_precision(model, "bf16-exact")
    record = find_binary_kernels(model)
    assert record == find_binary_kernels(create_model("mnist-bnn"))
    calls = trace_layers(model, torch.randn(1, 1, 28, 28)).calls
    kinds = [c.kernel for c in calls if c.weight in record.names]
    assert kinds == ["as-is"] * 3  # the weights themselves, not the product's bf16 copies


def test_without_an_input_shape_bnnexport_layers_are_found_by_type():
    model = nn.Sequential(BinaryConv2d(8, 8, 3), nn.Flatten())
    record = find_binary_kernels(model)
    assert (record.found_by, record.names) == ("layer type", ["0.weight"])
    with pytest.raises(NoBinaryKernelError, match="pass example_input"):
        find_binary_kernels(hand_written_bnn())


def test_the_record_round_trips_and_is_checked_against_the_model():
    model = own_models.plus_minus_one_bnn()
    record = find_binary_kernels(model, MNIST)
    again = BinaryKernels.from_json(record.to_json())
    assert again == record and again.parameters == 32 * 32 * 9 * 2 + 10 * 32 * 7 * 7
    wider = own_models.plus_minus_one_bnn(num_classes=12)
    with pytest.raises(CheckpointError, match="'fc' \\[10, 1568\\] it records is of shape"):
        again.require_in(wider, "run")
    with pytest.raises(CheckpointError, match="malformed record"):
        BinaryKernels.from_json({"kernels": [{"shape": [1]}]}, "run")
