"""`summarize(model) -> SummaryReport`: precision, parameters, memory and MACs per layer.

Like larq's model summary: for every layer, the precision of its inputs and weights (1 bit or
32-bit float), its parameters, their memory at that precision, and its multiply-accumulates
(MACs) for one image; totals split binary vs float.

Everything comes from one forward pass PyTorch runs itself (`bnnexport.nn.discover.trace_layers`)
and the model's record of binary kernels: a layer is every conv, linear or matmul call the pass
makes, a module's own `nn.Conv2d` as much as `F.conv2d(ste(x), ste(self.w))` in a forward of
your own, with the MACs of the shapes it saw. Its weights are 1 bit when the record lists its
kernel, its input 1 bit when the call's input is binarized; binary MACs are those of calls with
both. Layers holding other parameters (BatchNorm, PReLU) get a row of their own without MACs,
and so does each other parameter of a module of yours (a learned scale).

Example:
    >>> from bnnexport.models import create_model
    >>> from bnnexport.stages.summary import summarize
    >>> report = summarize(create_model("mnist-bnn"))
    >>> report.binary_parameters, f"{report.binary_mac_share:.3f}"
    (456704, '0.990')
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from bnnexport.errors import ConfigError
from bnnexport.nn.discover import BinaryKernels, LayerCall, find_binary_kernels, trace_layers
from bnnexport.stages.report import Report


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
    binary_kernels: str = ""  # how the record was decided (`BinaryKernels.found_by`)

    def to_table(self) -> str:
        width = max([18, *(len(layer.name) + 2 for layer in self.layers)])
        header = f"{'layer':<{width}}{'kind':<14}{'in':>4}{'w':>4}{'output':>16}{'bin params':>12}"
        header += f"{'float params':>14}{'memory KiB':>12}{'MACs':>14}"
        lines = [f"model {self.model}, input {tuple(self.input_shape)}", header, "-" * len(header)]
        for layer in self.layers:
            lines.append(
                f"{layer.name:<{width}}{layer.kind:<14}{layer.input_bits:>4}{layer.weight_bits:>4}"
                f"{str(tuple(layer.output_shape)):>16}{layer.binary_parameters:>12,}"
                f"{layer.float_parameters:>14,}{layer.memory_bytes / 1024:>12.1f}{layer.macs:>14,}"
            )
        lines += [
            "-" * len(header),
            f"binary parameters   {self.binary_parameters:,} (kernels {self.binary_kernels})",
            f"float parameters    {self.float_parameters:,}",
            f"size, 1-bit packed  {self.packed_bytes / 1024:,.1f} KiB",
            f"size, float32       {self.float32_bytes / 1024:,.1f} KiB "
            f"({self.compression:.1f}x larger)",
            f"binary MACs         {self.binary_macs:,} ({100 * self.binary_mac_share:.1f} %)",
            f"float MACs          {self.float_macs:,}",
        ]
        return "\n".join(lines)


def summarize(
    model: nn.Module,
    input_shape: tuple[int, ...] | None = None,
    kernels: BinaryKernels | None = None,
) -> SummaryReport:
    """Summarise `model` for one image of `input_shape` (default: the model's own).

    `kernels` is the model's record of binary kernels (what a run carries); None decides it
    now with the one function training uses.

    Raises:
        ConfigError when the input shape is unknown; InputShapeError when the model cannot
        take it.
    """
    config = getattr(model, "bnnexport_config", {})
    shape = [int(v) for v in (input_shape or config.get("input_shape") or [])]
    if not shape:
        raise ConfigError("input_shape is needed for a model not built by create_model")
    example = torch.randn(1, *shape, generator=torch.Generator().manual_seed(0))
    trace = trace_layers(model, example)
    if kernels is None:
        kernels = find_binary_kernels(model, trace=trace)
    report = SummaryReport(
        model=config.get("name", type(model).__name__),
        input_shape=shape,
        layers=_rows(model, trace.calls, trace.outputs, trace.finished, set(kernels.names)),
        binary_kernels=kernels.found_by,
    )
    _add_totals(report)
    return report


def _rows(
    model: nn.Module,
    calls: list[LayerCall],
    outputs: dict[str, list[int]],
    finished: dict[str, int],
    binary: set[str],
) -> list[LayerSummary]:
    """One row per layer call, in the order of the forward pass, and one per module whose own
    parameters no call used, placed where the module returned (at the end if it never did)."""
    claimed: set[str] = set()
    call_rows = [_call_row(model, call, binary, claimed) for call in calls]
    module_rows: list[tuple[int, LayerSummary]] = []
    for name, module in model.named_modules():
        own = {f"{name}.{p}" if name else p: v for p, v in module.named_parameters(recurse=False)}
        rest = {key: value for key, value in own.items() if key not in claimed}
        if not rest:
            continue
        claimed.update(rest)  # a module the pass never returned from still counts them
        output, at = outputs.get(name, []), finished.get(name, len(call_rows))
        if type(module).__module__.startswith("torch.nn"):  # a layer: BatchNorm, PReLU
            row = _row(name, type(module).__name__, 32, rest, binary, output)
            module_rows.append((at, row))
        else:  # bare parameters of a module of your own (a learned scale): one row each
            for key, value in rest.items():
                module_rows.append((at, _row(key, "parameter", 32, {key: value}, binary, [])))
    rows: list[LayerSummary] = []
    for position in range(len(call_rows) + 1):
        rows += [row for at, row in module_rows if at == position]
        if position < len(call_rows):
            rows.append(call_rows[position])
    return rows


def _call_row(
    model: nn.Module, call: LayerCall, binary: set[str], claimed: set[str]
) -> LayerSummary:
    """A conv/linear/matmul call's row: named by its module when the call is that module's own
    weight (an `nn.Conv2d`), else by the weight's parameter (`self.w` of a forward of yours)."""
    module = model.get_submodule(call.module)
    own = call.weight is not None and call.weight == _qualified(call.module, "weight")
    if own:
        name, kind = call.module or "(model)", type(module).__name__
        params = {_qualified(call.module, p): v for p, v in module.named_parameters(recurse=False)}
    else:
        name, kind = call.weight or f"{call.module or '(model)'}: {call.op}", call.op
        params = {call.weight: model.get_parameter(call.weight)} if call.weight else {}
    params = {key: value for key, value in params.items() if key not in claimed}
    claimed.update(params)
    input_bits = 1 if call.binary_input else 32
    row = _row(name, kind, input_bits, params, binary, list(call.output_shape))
    row.weight_bits = 1 if call.weight in binary else 32
    row.macs = call.macs
    return row


def _qualified(module: str, parameter: str) -> str:
    return f"{module}.{parameter}" if module else parameter


def _row(
    name: str,
    kind: str,
    input_bits: int,
    params: dict[str, torch.Tensor],
    binary: set[str],
    output: list[int],
) -> LayerSummary:
    n_binary = sum(p.numel() for key, p in params.items() if key in binary)
    n_float = sum(p.numel() for key, p in params.items() if key not in binary)
    return LayerSummary(
        name=name,
        kind=kind,
        input_bits=input_bits,
        weight_bits=1 if n_binary else 32,
        output_shape=output,
        binary_parameters=n_binary,
        float_parameters=n_float,
        memory_bytes=n_binary / 8 + 4 * n_float,
        macs=0,
    )


def _add_totals(report: SummaryReport) -> None:
    for layer in report.layers:
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
