"""bf16 binary layers: `bf16-exact` must equal float32 bit for bit, forward and through training.

The sums a binary layer forms are integers; bf16 stores them exactly only below 256 (512 for
even sums), so the tests use inputs whose sums stay small (random signs) and inputs whose sums
are as large as the fan-in (all +1), where only the float32 fallback keeps the result exact.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from support.cli import invoke

from bnnexport.models import create_model
from bnnexport.nn.layers import BinaryConv2d, BinaryLinear, binary_parameters, set_precision
from bnnexport.nn.precision import RETRY, cpu_has_bf16, exact_bound, resolve_precision
from bnnexport.optim.composite import bop_with_adam
from bnnexport.training.flips import FlipCounter


def _signs(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, shape, generator=generator).float() * 2 - 1


def _layers() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [
        BinaryConv2d(64, 32, 3, padding=1),  # +1 padding: every term ±1, fan-in 576 even
        BinaryConv2d(33, 16, 3, stride=2, padding=1, pad_value="zero"),  # zero padding
        BinaryConv2d(31, 16, 3),  # fan-in 279, odd: exact only below 256
        BinaryLinear(600, 24),
    ]


def _inputs(layer: torch.nn.Module, fill: float | None) -> torch.Tensor:
    linear = isinstance(layer, BinaryLinear)
    shape = (5, layer.in_features) if linear else (5, layer.in_channels, 9, 9)
    x = _signs(*shape) if fill is None else torch.full(shape, fill)
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


@pytest.mark.parametrize("fill", [None, 1.0, -0.5], ids=["random-signs", "all-plus", "all-minus"])
def test_bf16_exact_forward_equals_float32_bit_for_bit(fill):
    for layer in _layers():
        x = _inputs(layer, fill)
        if fill is not None:  # sums as large as the fan-in: only the fallback is exact
            with torch.no_grad():
                layer.weight.fill_(1.0)
        expected = layer(x)
        set_precision(layer, "bf16-exact")
        got = layer(x)
        assert torch.equal(got, expected), f"{layer}: max |diff| {(got - expected).abs().max()}"
        assert layer.product is not None and layer.product.calls == 1
        # all-equal signs reach the fan-in (>= 279 > 256): the check must have sent them to float32
        assert layer.product.fallbacks == (0 if fill is None else 1)


def test_random_sign_sums_are_computed_in_bf16_not_recomputed():
    """The fast path is taken: random ±1 sums stay far below the bound."""
    layer = BinaryConv2d(128, 64, 3, padding=1)
    set_precision(layer, "bf16-exact")
    layer(_inputs(layer, None))
    assert layer.product.fallbacks == 0 and layer.product.calls == 1


def test_a_layer_that_keeps_falling_back_stops_trying_bf16_and_retries():
    """Sums at the fan-in every call: after two bf16 tries, float32 straight away, except a
    retry every RETRY-th call; every result still the float32 one."""
    layer = BinaryLinear(301, 4)  # odd fan-in: exact below 256 only
    with torch.no_grad():
        layer.weight.fill_(1.0)
    x = torch.ones(2, 301)
    set_precision(layer, "bf16-exact")
    product, tries = layer.product, []
    plain = product.apply
    product.apply = lambda a, w: (
        (a.dtype == torch.bfloat16 and tries.append(product.calls)) or (plain(a, w))
    )
    for _ in range(2 * RETRY):
        assert torch.equal(layer(x), torch.full((2, 4), 301.0))
    assert product.fallbacks == product.calls == 2 * RETRY
    assert tries == [1, 2, RETRY, 2 * RETRY]


def test_exact_bound_is_tight():
    """Every integer below the bound survives a bf16 round trip; the bound itself is the first
    that may not (257 for 256; an even sum: 514 for 512)."""
    for bound, step in ((exact_bound(7, True), 1), (exact_bound(8, True), 2)):
        values = torch.arange(-bound + step, bound, step)
        assert torch.equal(values.bfloat16().float(), values)
        beyond = torch.tensor([bound + step])
        assert not torch.equal(beyond.bfloat16().float(), beyond)


def _train(precision: str, steps: int) -> tuple[list[float], list[int], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = create_model("binarynet", input_shape=(3, 16, 16), widths=(32, 32, 64, 64, 64, 64),
                         hidden=64).train()  # fmt: skip
    model = model.to(memory_format=torch.channels_last)
    set_precision(model, precision)
    optimizer = bop_with_adam(model, 1e-3, 1e-6, 1e-2)
    counter = FlipCounter(model)
    x = torch.rand((12, 3, 16, 16), generator=torch.Generator().manual_seed(1)) * 2 - 1
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.arange(12) % 10
    losses, flips = [], []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        counter.before_step()
        optimizer.step()
        flips.append(sum(f for f, _ in counter.after_step().values()))
        losses.append(loss.item())
    return losses, flips, [p.detach().clone() for p in model.parameters()]


def test_bf16_exact_training_is_float32_training_bit_for_bit():
    """Same losses, same Bop flips at every step, same parameters after 6 steps: gradients are
    identical, so the backward is too."""
    reference = _train("float32", 6)
    fast = _train("bf16-exact", 6)
    assert sum(reference[1]) > 0, "no flips: the comparison would be empty"
    assert fast[0] == reference[0]
    assert fast[1] == reference[1]
    for got, expected in zip(fast[2], reference[2], strict=True):
        assert torch.equal(got, expected)


def test_bf16_gradients_are_bf16_roundings_of_the_float32_ones():
    """The opt-in `bf16` mode: same forward, gradients within bf16's rounding (not exact)."""
    layer = BinaryConv2d(64, 32, 3, padding=1)
    x = _inputs(layer, None).requires_grad_()
    grad = torch.randn(5, 32, 9, 9, generator=torch.Generator().manual_seed(2))
    expected = torch.autograd.grad(layer(x), [x, layer.weight], grad)
    set_precision(layer, "bf16")
    got = torch.autograd.grad(layer(x), [x, layer.weight], grad)
    for g, e in zip(got, expected, strict=True):
        scale = e.abs().max()
        assert (g - e).abs().max() <= 2**-6 * scale  # a few bf16 ulps of the largest entry
        assert not torch.equal(g, e)  # it does round: this mode is not the exact one


def test_copies_and_the_first_layer_stay_float32():
    model = create_model("binarynet", input_shape=(3, 16, 16), widths=(8, 8, 8, 8, 8, 8), hidden=8)
    set_precision(model, "bf16-exact")
    first = model.features[0]
    assert first.input_quantizer is None and first.bf16_product(torch.zeros(1)) is None
    assert all(p.dtype == torch.float32 for p in binary_parameters(copy.deepcopy(model)))
    set_precision(model, "float32")
    assert all(layer.product is None for layer in model.modules() if hasattr(layer, "product"))


def test_auto_is_bf16_exact_only_with_bf16_hardware():
    assert resolve_precision("auto", "cpu") == ("bf16-exact" if cpu_has_bf16() else "float32")
    with pytest.raises(ValueError, match="unknown precision 'half'"):
        resolve_precision("half", "cpu")


def test_runs_saved_with_amp_resume_with_the_matching_precision(tmp_path):
    """config.json from before --precision has `amp`; a resume reads it as the same mode."""
    from bnnexport.training.config import TrainConfig
    from bnnexport.training.resume import resumed_config

    for amp, precision in ((True, "amp"), (False, "float32")):
        saved = {k: v for k, v in TrainConfig().to_json().items() if k != "precision"}
        saved["amp"] = amp
        config, changes = resumed_config({"config": saved}, TrainConfig(), None, tmp_path)
        assert config.precision == precision and changes == {}


def test_bad_precision_is_one_line_exit_2():

    result = invoke("train", "--precision", "half")
    assert result.exit_code == 2
    assert "'half' is not one of" in result.output and "Traceback" not in result.output
