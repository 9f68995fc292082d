"""bnnexport.nn.int8: PyTorch's fake quantization on a BNN's float layers, the binary layers left
alone; kernels per output channel on the int8 grid the converter stores; what export writes."""

from __future__ import annotations

import torch
from torch import nn

from bnnexport.models import create_model
from bnnexport.nn.int8 import (
    Int8Conv2d,
    Int8Linear,
    fake_quantization,
    fake_quantize_kernel,
    for_export,
    prepare_int8,
)
from bnnexport.stages.torch_probe import activation_quantizers

BINARY = {"features.2.weight", "features.5.weight", "classifier.1.weight"}  # mnist-bnn's
EXAMPLE = torch.zeros(1, 1, 28, 28)


def _prepared(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = create_model("mnist-bnn")
    prepare_int8(model, EXAMPLE, BINARY)
    return model


def test_only_the_float_layers_get_fake_quantization():
    model = _prepared()
    assert model.int8_layers == ["features.0", "classifier.3"]
    assert isinstance(model.features[0], Int8Conv2d) and isinstance(model.classifier[3], Int8Linear)
    binary = [model.features[2], model.features[5], model.classifier[1]]
    assert not any(isinstance(m, (Int8Conv2d, Int8Linear)) for m in binary)
    # the stem's input, its unit's output (after the BatchNorm), the head's input and output
    owners = [n for n, m in model.named_modules() if hasattr(m, "int8_output")]
    assert owners == ["features.1", "classifier.3"]
    assert len(activation_quantizers(model)) == 4


def test_kernels_are_quantized_per_output_channel_to_at_most_127_steps():
    weight = torch.randn(8, 3, 3, 3) * torch.arange(1, 9).reshape(8, 1, 1, 1)
    fake = fake_quantize_kernel(weight)
    scale = weight.abs().amax(dim=(1, 2, 3), keepdim=True) / 127
    steps = fake / scale
    assert torch.allclose(steps, steps.round(), atol=1e-3)
    assert steps.abs().amax(dim=(1, 2, 3)).round().tolist() == [127.0] * 8


def test_preparing_twice_changes_nothing_and_a_saved_state_loads_into_a_fresh_preparation():
    model = _prepared()
    model.train()
    model(torch.randn(16, 1, 28, 28))  # the observers learn a range
    assert prepare_int8(model, EXAMPLE, BINARY) == ["features.0", "classifier.3"]
    fresh = _prepared(seed=1)
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(fresh.eval()(x), model.eval()(x))


def test_ranges_are_learnt_in_training_mode_only():
    model = _prepared()
    quantizer = activation_quantizers(model)[0]
    model.train()
    model(torch.randn(8, 1, 28, 28) * 3)
    learnt = quantizer.scale.clone()
    model.eval()
    model(torch.randn(8, 1, 28, 28) * 30)
    assert torch.equal(quantizer.scale, learnt)


def test_fake_quantization_off_is_the_float_model_and_comes_back_on():
    model = _prepared().eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        quantized = model(x)
        with fake_quantization(model, False):
            plain = model(x)
        again = model(x)
    assert not torch.equal(quantized, plain) and torch.equal(quantized, again)


def test_export_writes_kernels_on_their_grid_and_computes_what_training_computes():
    model = _prepared()
    model.train()
    model(torch.randn(16, 1, 28, 28))
    model.eval()
    frozen = for_export(model)
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(frozen(x), model(x))
    stem = frozen.features[0]
    assert not stem.int8_enabled and torch.equal(stem.weight, fake_quantize_kernel(stem.weight))
    assert model.features[0].int8_enabled  # the trained model is left as it was


def test_a_model_without_fake_quantization_exports_as_it_is():
    model = create_model("mnist-bnn")
    assert for_export(model) is model


def test_a_grouped_conv_that_is_not_depthwise_stays_float():
    net = nn.Sequential(nn.Conv2d(4, 8, 3, groups=2), nn.Flatten(), nn.Linear(8 * 4 * 4, 2))
    assert prepare_int8(net, torch.zeros(1, 4, 6, 6), set()) == ["2"]
