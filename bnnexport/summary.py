"""`summary(model) -> SummaryReport`: precision, parameters, memory and MACs per layer.

Like larq's model summary: for every layer with parameters, the precision of its inputs and
weights (1 bit or 32-bit float), its parameters, their memory at that precision, and its
multiply-accumulates (MACs) for one image; totals split binary vs float.

Example:
    >>> from bnnexport.models import create_model
    >>> from bnnexport.summary import summarize
    >>> report = summarize(create_model("mnist-bnn"))
    >>> report.binary_parameters
    456704
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from bnnexport.layers import BinaryLayer
from bnnexport.reports import Report


@dataclass
class LayerSummary:
    name: str
    kind: str
    input_bits: int
    weight_bits: int
    output_shape: list[int]
    binary_parameters: int
    float_parameters: int
    memory_bytes: float
    macs: int


@dataclass
class SummaryReport(Report):
    model: str
    input_shape: list[int]
    layers: list[LayerSummary] = field(default_factory=list)
    binary_parameters: int = 0
    float_parameters: int = 0
    packed_bytes: float = 0.0  # binary kernels at 1 bit, the rest at float32
    float32_bytes: int = 0  # everything at float32
    compression: float = 0.0  # float32_bytes / packed_bytes
    binary_macs: int = 0
    float_macs: int = 0
    binary_mac_share: float = 0.0

    def to_table(self) -> str:
        header = f"{'layer':<18}{'kind':<14}{'in':>4}{'w':>4}{'output':>16}{'bin params':>12}"
        header += f"{'float params':>14}{'memory KiB':>12}{'MACs':>14}"
        lines = [f"model {self.model}, input {tuple(self.input_shape)}", header, "-" * len(header)]
        for layer in self.layers:
            lines.append(
                f"{layer.name:<18}{layer.kind:<14}{layer.input_bits:>4}{layer.weight_bits:>4}"
                f"{str(tuple(layer.output_shape)):>16}{layer.binary_parameters:>12,}"
                f"{layer.float_parameters:>14,}{layer.memory_bytes / 1024:>12.1f}{layer.macs:>14,}"
            )
        lines += [
            "-" * len(header),
            f"binary parameters   {self.binary_parameters:,}",
            f"float parameters    {self.float_parameters:,}",
            f"size, 1-bit packed  {self.packed_bytes / 1024:,.1f} KiB",
            f"size, float32       {self.float32_bytes / 1024:,.1f} KiB "
            f"({self.compression:.1f}x larger)",
            f"binary MACs         {self.binary_macs:,} ({100 * self.binary_mac_share:.1f} %)",
            f"float MACs          {self.float_macs:,}",
        ]
        return "\n".join(lines)


def _macs(module: nn.Module, output: torch.Tensor) -> int:
    if isinstance(module, nn.Conv2d):
        per_output = module.weight[0].numel()
        return int(output[0].numel() * per_output)
    if isinstance(module, nn.Linear):
        return int(module.in_features * module.out_features)
    return 0


@torch.no_grad()
def summarize(model: nn.Module, input_shape: tuple[int, ...] | None = None) -> SummaryReport:
    """Summarise `model` for one image of `input_shape` (default: the model's own)."""
    config = getattr(model, "bnnexport_config", {})
    shape = list(input_shape or config.get("input_shape") or [])
    if not shape:
        raise ValueError("input_shape is needed for a model not built by create_model")
    outputs, macs = _trace_layers(model, shape)
    report = SummaryReport(model=config.get("name", type(model).__name__), input_shape=shape)
    for name, module in model.named_modules():
        if name not in outputs:
            continue
        layer = _layer_summary(name, module, outputs[name], macs[name])
        report.layers.append(layer)
        report.binary_parameters += layer.binary_parameters
        report.float_parameters += layer.float_parameters
        if layer.weight_bits == 1 and layer.input_bits == 1:
            report.binary_macs += layer.macs
        else:
            report.float_macs += layer.macs
    report.packed_bytes = report.binary_parameters / 8 + 4 * report.float_parameters
    report.float32_bytes = 4 * (report.binary_parameters + report.float_parameters)
    report.compression = report.float32_bytes / max(report.packed_bytes, 1e-9)
    total_macs = report.binary_macs + report.float_macs
    report.binary_mac_share = report.binary_macs / total_macs if total_macs else 0.0
    return report


def _trace_layers(
    model: nn.Module, shape: list[int]
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """One eval-mode forward of a zero image: each parameterised module's output shape and MACs."""
    outputs: dict[str, list[int]] = {}
    macs: dict[str, int] = {}
    hooks = []
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):

            def hook(mod, _inputs, output, name=name):
                outputs[name] = list(output.shape[1:])
                macs[name] = _macs(mod, output)

            hooks.append(module.register_forward_hook(hook))
    was_training = model.training
    model.eval()
    try:
        model(torch.zeros([1, *shape]))
    finally:
        model.train(was_training)
        for handle in hooks:
            handle.remove()
    return outputs, macs


def _layer_summary(name: str, module: nn.Module, output: list[int], macs: int) -> LayerSummary:
    binary = isinstance(module, BinaryLayer)
    own = list(module.parameters(recurse=False))
    n_binary = module.weight.numel() if binary else 0
    n_float = sum(p.numel() for p in own) - n_binary
    input_bits = 1 if binary and module.input_quantizer is not None else 32
    return LayerSummary(
        name=name,
        kind=type(module).__name__,
        input_bits=input_bits,
        weight_bits=1 if binary else 32,
        output_shape=output,
        binary_parameters=n_binary,
        float_parameters=n_float,
        memory_bytes=n_binary / 8 + 4 * n_float,
        macs=macs,
    )
