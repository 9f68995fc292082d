"""`verify(path) -> VerifyReport`: prove that a model's binary kernels are strictly ±1.

Three kinds of input, told apart by their suffix:

- a run directory or a checkpoint (`.pt`): every binary kernel of the model's record (the one
  `bnnexport.nn.discover.BinaryKernels` training or `init` wrote, read by every stage) must hold
  only -1.0 and +1.0, with no 0, no NaN and no leftover scale; in bnnexport's own layers the
  input must be quantized by a registered quantizer (a layer built with `input_quantizer=None`,
  a first layer's real-valued input, is accepted and reported as such, and so is one of more
  than 1 bit, DoReFa-Net's 2-bit activations: a binary kernel, but no binary layer for LCE);
- a packed model (`.safetensors`, see `bnnexport.stages.pack`): loaded with the record it carries,
  then checked like a checkpoint;
- an ONNX model (`.onnx`): every Conv/MatMul/Gemm fed by a binarization pattern
  (`converters.patterns.find_binary_layers`) must have a ±1 kernel; ±1 times one positive scale
  per output channel (BatchNorm folded in by the exporter) is accepted and reported as such.

A model with no binary layer at all does not verify: "nothing to check" must not read as a pass.

The library returns a report either way; `require_strict(report)` turns a failed one into
`NotBinaryError` (exit 1). Missing, truncated or foreign files raise `CheckpointError` or
`converters.errors.InvalidModelError` (exit 2).

Example:
    >>> from bnnexport.stages.verify import verify
    >>> report = verify("runs/demo")                      # doctest: +SKIP
    >>> report.strict, report.binary_parameters           # doctest: +SKIP
    (True, 456704)
    >>> print(report.to_table())                          # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bnnexport.errors import NotBinaryError
from bnnexport.nn.discover import BinaryKernel, BinaryKernels, find_binary_kernels
from bnnexport.nn.layers import BinaryLayer, binary_layers
from bnnexport.nn.quantizers import Quantizer, get_quantizer, list_quantizers
from bnnexport.run.checkpoint import open_run_model
from bnnexport.run.directory import RunDir
from bnnexport.stages.report import Report

EXAMPLES = 5  # off values quoted per offending layer


@dataclass
class LayerCheck:
    """The verdict on one binary layer.

    `kernel` is ``"strict"`` (every value ±1), ``"scaled"`` (ONNX only: ±1 times one positive
    scale per output channel) or ``"offending"``; `input` names what binarizes the layer's input
    (a quantizer or an ONNX pattern), ``"real (first layer)"``, or why it is not supported.
    `off` counts kernel values that are not ±1 and `examples` quotes a few as [index, value].
    """

    name: str
    op: str
    shape: list[int]
    values: int
    kernel: str
    input: str
    strict: bool
    off: int = 0
    examples: list[list[Any]] = field(default_factory=list)
    scale_range: list[float] | None = None
    zeros: int = 0  # exact zeros in an otherwise ±1 kernel (sign(w) of a weight with zeros)

    def describe(self) -> str:
        """One line saying what is wrong with this layer (empty when nothing is)."""
        parts = []
        if self.off:
            quoted = ", ".join(f"{_index(i)}={_number(v)}" for i, v in self.examples)
            more = ", ..." if self.off > len(self.examples) else ""
            parts.append(f"{self.off} of {self.values} kernel values are not ±1: {quoted}{more}")
        if self.zeros:
            parts.append("sign(w) maps 0 to 0: binarize with torch.where(w >= 0, 1.0, -1.0)")
        if self.input.startswith("unsupported"):
            parts.append(f"input {self.input}")
        if not parts and not self.strict:
            parts.append(f"kernel is {self.kernel}")
        return f"{self.name} ({self.op}): " + "; ".join(parts) if parts else ""


@dataclass
class VerifyReport(Report):
    """What `bnnexport verify` prints (and writes to RUN_DIR/verify.json for a run)."""

    strict: bool
    binary_parameters: int
    layers: list[LayerCheck]
    offending: list[dict[str, Any]]  # name, off, examples, message (one line)
    source: str = ""
    kind: str = ""  # "checkpoint", "packed" or "onnx"

    def to_table(self) -> str:
        """A summary line, then one line per binary layer."""
        verdict = "strict" if self.strict else "NOT BINARY"
        lines = [
            f"{self.source} ({self.kind}): {verdict}, {len(self.layers)} binary layers, "
            f"{self.binary_parameters} binary parameters"
        ]
        width = max((len(layer.name) for layer in self.layers), default=0)
        for layer in self.layers:
            scale = ""
            if layer.scale_range:
                scale = f", scale {layer.scale_range[0]:.4g}..{layer.scale_range[1]:.4g}"
            lines.append(
                f"  {layer.name.ljust(width)}  {layer.op:<13} {str(layer.shape):<18} "
                f"kernel {layer.kernel}{scale}, input {layer.input}"
            )
        lines += [f"  offending: {item['message']}" for item in self.offending]
        return "\n".join(lines)


def _index(index: Any) -> str:
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def _number(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:g}"


def _finite_or_text(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _input_check(layer: BinaryLayer) -> str:
    """What binarizes the layer's input; ``"unsupported: ..."`` when nothing supported does."""
    quantizer = layer.input_quantizer
    if quantizer is None:
        return "real (first layer)"
    if not isinstance(quantizer, Quantizer):
        return f"unsupported: {type(quantizer).__name__} is not a Quantizer"
    name = getattr(quantizer, "name", "")
    if name not in list_quantizers() or not isinstance(quantizer, type(get_quantizer(name))):
        return f"unsupported: quantizer {type(quantizer).__name__} is not registered"
    if quantizer.precision != 1:  # a k-bit input: the kernel is binary, the layer is not
        return f"{name} ({quantizer.precision}-bit, not binary)"
    return name


def check_kernel(kernel: torch.Tensor) -> tuple[int, list[list[Any]]]:
    """(how many values are not exactly ±1, the first few as [index, value])."""
    values = kernel.detach().cpu()
    # NaN != 1, so NaN counts as off; so do 0, -0.0 and any scaled value
    off = values.abs() != 1
    count = int(off.sum())
    where = off.nonzero()[:EXAMPLES].tolist() if count else []
    # JSON has no NaN: non-finite values are quoted as strings ("nan", "inf")
    quoted = [float(values[tuple(index)]) for index in where]
    return count, [[i, _finite_or_text(v)] for i, v in zip(where, quoted, strict=True)]


def verify_model(
    model: nn.Module,
    source: str = "model",
    kind: str = "checkpoint",
    kernels: BinaryKernels | None = None,
) -> VerifyReport:
    """Check every binary kernel of a PyTorch model: strictly ±1, and in bnnexport's own layers
    an input binarized by a registered quantizer.

    `kernels` is the model's record (what a checkpoint or packed file carries); None decides it
    now, with the one function training uses (`bnnexport.nn.discover.find_binary_kernels`).
    """
    if kernels is None:
        kernels = find_binary_kernels(model)
    owners = {f"{name}.weight" if name else "weight": (name, m) for name, m in binary_layers(model)}
    params = dict(model.named_parameters())
    checks = [_kernel_check(k, params[k.name], owners.get(k.name)) for k in kernels]
    return _report(checks, source, kind)


def _kernel_check(
    kernel: BinaryKernel, weight: torch.Tensor, owner: tuple[str, BinaryLayer] | None
) -> LayerCheck:
    """The verdict on one recorded kernel. In bnnexport's own layer it is named by the layer
    and its input quantizer is checked; in a model of your own by its parameter, its input as
    the trace saw it."""
    # the stored weight, even in latent mode: it is what a checkpoint or a pack carries on
    off, examples = check_kernel(weight)
    if owner is not None:
        name, op, given = owner[0] or "(root)", type(owner[1]).__name__, _input_check(owner[1])
    else:
        name, op, given = kernel.name, kernel.layer.rpartition(": ")[2] or "kernel", _input(kernel)
    return LayerCheck(
        name=name, op=op, shape=list(weight.shape), values=weight.numel(),
        kernel="offending" if off else "strict", input=given,
        strict=not off and not given.startswith("unsupported"), off=off, examples=examples,
    )  # fmt: skip


def _input(kernel: BinaryKernel) -> str:
    """What the record says of a kernel's input."""
    if kernel.binary_input is None:
        return "not traced (named)"
    return "binarized (found by tracing)" if kernel.binary_input else "real (found by tracing)"


def _report(checks: list[LayerCheck], source: str, kind: str) -> VerifyReport:
    offending = [
        {"name": c.name, "off": c.off, "examples": c.examples, "message": c.describe()}
        for c in checks
        if not c.strict
    ]
    if not checks:
        message = f"{source}: no binary layers found, nothing is binary"
        offending.append({"name": source, "off": 0, "examples": [], "message": message})
    return VerifyReport(
        strict=not offending,
        binary_parameters=sum(check.values for check in checks),
        layers=checks,
        offending=offending,
        source=source,
        kind=kind,
    )


def verify_onnx(path: str | os.PathLike) -> VerifyReport:
    """Check every binary Conv/MatMul/Gemm of an ONNX file (kernel ±1 or ±1 x scale).

    The graph is normalised first, exactly as `convert` does (weights binarized in the graph
    folded, each library's binarization mapped to the canonical one), so verify and convert
    find the same binary layers in the same file."""
    from bnnexport.converters.graph import load_onnx
    from bnnexport.converters.normalize import normalize
    from bnnexport.converters.patterns import find_binary_layers, sign_zeros

    checks = []
    normalized, _ = normalize(load_onnx(path))
    for match in find_binary_layers(normalized):
        if match.strict:
            kernel, scale_range = "strict", None
        elif match.scale is not None:
            kernel = "scaled"
            scale_range = [float(match.scale.min()), float(match.scale.max())]
        else:
            kernel, scale_range = "offending", None
        checks.append(
            LayerCheck(
                name=match.node_name,
                op=match.op_type,
                shape=list(match.kernel.shape),
                values=int(match.kernel.size),
                kernel=kernel,
                input=match.pattern,
                strict=match.binary,
                off=match.num_off,
                examples=[
                    [list(index), _finite_or_text(value)] for index, value in match.off_examples
                ],
                scale_range=scale_range,
                zeros=sign_zeros(match),
            )
        )
    return _report(checks, str(path), "onnx")


def verify(path: str | os.PathLike) -> VerifyReport:
    """Verify a run directory, checkpoint, packed `.safetensors` or `.onnx` file.

    A run directory's checkpoint is verified and the report written to RUN_DIR/verify.json.

    Raises:
        CheckpointError / InvalidModelError (exit 2) for a missing, truncated or foreign file.
    """
    path = Path(path)
    if path.is_dir():
        return verify_run(path)
    if path.suffix.lower() == ".onnx":
        return verify_onnx(path)
    loaded = open_run_model(path)
    kind = "packed" if path.suffix.lower() == ".safetensors" else "checkpoint"
    return verify_model(loaded.model, str(path), kind, loaded.kernels)


def verify_run(run_dir: str | os.PathLike) -> VerifyReport:
    """Verify a run directory's checkpoint and write RUN_DIR/verify.json."""
    run = RunDir(run_dir).require()
    loaded = open_run_model(run.root)
    report = verify_model(loaded.model, str(run.root), "checkpoint", loaded.kernels)
    report.save(run.root / "verify.json")
    return report


def require_strict(report: VerifyReport) -> VerifyReport:
    """Return `report` if it is strict, else raise NotBinaryError naming the offending layers."""
    if not report.strict:
        raise NotBinaryError(
            f"{report.source} does not verify: "
            + " | ".join(item["message"] for item in report.offending)
        )
    return report
