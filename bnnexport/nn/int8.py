"""Quantization-aware training of a BNN's float layers: PyTorch's own fake quantization around
every float conv and dense layer, the binary layers untouched.

`prepare_int8(model, example, binary)` changes `model` in place, the same way every time for
the same model (so a checkpoint's state loads after it), and returns the layers it quantized:

- each float `nn.Conv2d` (groups 1, or depthwise) and `nn.Linear` that holds no binary kernel
  computes with its weight fake-quantized per output channel, symmetric, at max |w| / 127
  (`torch.fake_quantize_per_channel_affine`, integers in [-127, 127]): the integers the
  converter stores (`converters.quantize`; a BatchNorm folded in later scales each channel,
  which keeps them);
- its input goes through a `torch.ao.quantization.FakeQuantize` (int8, per tensor, moving-average
  min-max observer) registered on it as `int8_input`, unless another quantized layer's output
  is its input;
- the output of its *unit* (the layer, then the BatchNorm module reading it alone, then a ReLU
  module reading that alone: what TFLite runs as one int8 op) through one registered on the
  unit's last module as `int8_output`.

The observers learn the ranges while the model trains and stop in eval mode; the straight-through
estimator passes gradients inside the range. Exported with the legacy exporter each
FakeQuantize becomes `QuantizeLinear -> DequantizeLinear`: the ranges `convert` carries into the
int8 flatbuffer instead of calibrating. `fake_quantization(model, False)` turns it all off (the
float model, for the export check of the graph).

Example:
    >>> import torch
    >>> from bnnexport.models import create_model
    >>> model = create_model("mnist-bnn")
    >>> prepare_int8(model, torch.zeros(1, 1, 28, 28), binary={"features.2.weight",
    ...     "features.5.weight", "classifier.1.weight"})
    ['features.0', 'classifier.3']
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

KERNEL_LIMIT = 127  # int8 kernels: symmetric, [-127, 127], zero point 0


def fake_quantize_kernel(weight: torch.Tensor) -> torch.Tensor:
    """`weight` fake-quantized per output channel (axis 0) at max |w| / 127 (1 for an all-zero
    channel), gradients passed straight through."""
    top = weight.detach().abs().amax(dim=tuple(range(1, weight.dim())))
    scale = torch.where(top > 0, top / KERNEL_LIMIT, torch.ones_like(top)).float()
    zero = torch.zeros_like(scale, dtype=torch.int32)
    # |w| <= 127 scales: the integers stay in [-127, 127]; the exporter takes only the int8
    # range's own bounds, (-128, 127)
    return torch.fake_quantize_per_channel_affine(weight, scale, zero, 0, -128, 127)


class Int8Conv2d(nn.Conv2d):
    """An `nn.Conv2d` whose weight is fake-quantized per output channel when it computes."""

    int8_enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = fake_quantize_kernel(self.weight) if self.int8_enabled else self.weight
        return self._conv_forward(x, weight, self.bias)


class Int8Linear(nn.Linear):
    """An `nn.Linear` whose weight is fake-quantized per output channel when it computes."""

    int8_enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = fake_quantize_kernel(self.weight) if self.int8_enabled else self.weight
        return F.linear(x, weight, self.bias)


QUANTIZED = {nn.Conv2d: Int8Conv2d, nn.Linear: Int8Linear}


def activation_quantizer() -> nn.Module:
    """PyTorch's FakeQuantize for an int8 activation: per tensor, asymmetric, its range a moving
    average of each batch's min and max (0 always inside)."""
    from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver

    return FakeQuantize(
        observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127,
        dtype=torch.qint8, qscheme=torch.per_tensor_affine,
    )  # fmt: skip


def _quantize_input(module: nn.Module, args: tuple) -> tuple:
    return (_observed(module.int8_input, module.training)(args[0]), *args[1:])


def _quantize_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return _observed(module.int8_output, module.training)(output)


def _observed(quantizer: nn.Module, training: bool) -> nn.Module:
    """`quantizer` learning its range only while its module trains."""
    quantizer.observer_enabled[0] = int(training)
    return quantizer


def _float_layers(model: nn.Module, binary: set[str]) -> list[tuple[str, nn.Module]]:
    """The plain conv and dense modules holding no binary kernel, that int8 can run."""
    found = []
    for name, module in model.named_modules():
        if type(module) not in QUANTIZED or f"{name}.weight" in binary:
            continue
        if isinstance(module, nn.Conv2d) and module.groups not in (1, module.in_channels):
            continue  # grouped, not depthwise: the converter keeps it float
        found.append((name, module))
    return found


def _calls(model: nn.Module, example: torch.Tensor) -> list[tuple[nn.Module, Any, Any]]:
    """(module, input tensor, output tensor) of every leaf module call of one forward pass, in
    order; the tensors are kept alive, so their identities stay unique."""
    calls: list[tuple[nn.Module, Any, Any]] = []

    def record(module: nn.Module, args: tuple, output: Any) -> None:
        calls.append((module, args[0] if args else None, output))

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(record) for m in leaves]
    try:
        with torch.no_grad():
            model.eval()(example)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def _unit_end(layer: nn.Module, calls: list[tuple[nn.Module, Any, Any]]) -> nn.Module:
    """The last module of `layer`'s unit: a BatchNorm reading its output alone, then a ReLU
    reading that alone (module doc)."""
    end = layer
    for kinds in ((nn.BatchNorm1d, nn.BatchNorm2d), (nn.ReLU,)):
        output = next((o for m, _, o in calls if m is end), None)
        readers = [m for m, i, _ in calls if i is output and output is not None]
        if len(readers) == 1 and isinstance(readers[0], kinds):
            end = readers[0]
    return end


def prepare_int8(model: nn.Module, example: torch.Tensor, binary: Iterable[str]) -> list[str]:
    """Fake quantization for the float layers of `model`, in place (module doc); the names of
    the layers it quantized. `binary` names the binary kernels (the run's record): their layers
    are left as they are. Calling it twice changes nothing the second time."""
    if getattr(model, "int8_layers", None) is not None:
        return list(model.int8_layers)
    training = model.training
    layers = _float_layers(model, set(binary))
    calls = _calls(model, example)
    ends = {name: _unit_end(module, calls) for name, module in layers}
    outputs = {id(o) for m, _, o in calls if any(m is e for e in ends.values())}
    for name, module in layers:
        module.__class__ = QUANTIZED[type(module)]
        inputs = [i for m, i, _ in calls if m is module]
        if not inputs or id(inputs[0]) not in outputs:  # else already int8: a unit's output
            module.add_module("int8_input", activation_quantizer())
            module.register_forward_pre_hook(_quantize_input)
        end = ends[name]
        if not hasattr(end, "int8_output"):
            end.add_module("int8_output", activation_quantizer())
            end.register_forward_hook(_quantize_output)
    model.int8_layers = [name for name, _ in layers]
    model.train(training)
    return list(model.int8_layers)


def for_export(model: nn.Module) -> nn.Module:
    """`model` as `bnnexport export` writes it: one without fake quantization as it is; one
    prepared by `prepare_int8`, a copy in eval mode whose int8 kernels hold their
    fake-quantized values (the integers times their scales, which the converter quantizes back
    to the same integers) with the kernel quantization off, so the ONNX graph holds the kernels
    as constants, not the quantization's arithmetic. The activation quantizers stay: each is
    written as QuantizeLinear -> DequantizeLinear with its learnt scale and zero point."""
    if getattr(model, "int8_layers", None) is None:
        return model
    frozen = copy.deepcopy(model).eval()
    with torch.no_grad():
        for layer in frozen.modules():
            if isinstance(layer, (Int8Conv2d, Int8Linear)):
                layer.weight.copy_(fake_quantize_kernel(layer.weight))
                layer.int8_enabled = False
    return frozen


@contextlib.contextmanager
def fake_quantization(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Within the block, every fake quantization of `model` on (`enabled`) or off (the float
    model); as it was afterwards."""
    quantizers = [m for m in model.modules() if hasattr(m, "fake_quant_enabled")]
    layers = [m for m in model.modules() if isinstance(m, (Int8Conv2d, Int8Linear))]
    before = [int(q.fake_quant_enabled[0]) for q in quantizers]
    try:
        for quantizer in quantizers:
            quantizer.fake_quant_enabled[0] = int(enabled)
        for layer in layers:
            layer.int8_enabled = enabled
        yield
    finally:
        for quantizer, state in zip(quantizers, before, strict=True):
            quantizer.fake_quant_enabled[0] = state
        for layer in layers:
            del layer.int8_enabled  # back to the class's default (on)
