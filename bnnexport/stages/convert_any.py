"""`convert_module(model, example_input) -> ConvertReport`: any PyTorch BNN (`nn.Module`) to an LCE
flatbuffer, in one call.

It decides the module's binary kernels as training does (`bnnexport.nn.discover`), exports it to
ONNX beside the output, checks ONNX Runtime against PyTorch, and converts through the same gate
as `bnnexport convert` (`bnnexport.stages.convert`), on your samples or random inputs of its shape.

The export check is the gate of `bnnexport export`, with its tie replay, through the module's
traced binarizations for a module of your own; PyTorch's own outputs are then compared with the
flatbuffer's too, reported as `torch_argmax_agreement`. A model whose binarization inputs lie
within rounding of zero by the thousand (BatchNorm with its default statistics) cannot be
checked on real weights: the error says so, and `trust_twin=True` converts it on the strength of
the exact-grid twin (`trusted_twin` in the report, and a warning). On any refusal the gate's
diagnostics go to OUT-STEM-gate-refusal.json.

With `float_layers="int8"` the float layers run in int8 (`bnnexport convert --float-layers
int8`): calibrated on `calibration` (inputs of `example_input`'s shape, any batch), else on
`samples`; the flatbuffer is checked against the same int8 model in ONNX Runtime, and
`torch_argmax_agreement` is its agreement with the float module. `io="int8"` gives it int8
input and output. An image input (N, C, H, W in PyTorch) is taken as `input_layout` says:
"nhwc" (channels last, what an app on the device feeds) or "nchw"; None: the target's, NHWC
(`bnnexport convert --input-layout`). `samples` stay NCHW, as the module takes them.

Example:
    >>> import torch, torch.nn as nn
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3))  # any BNN, see README
    >>> report = convert_module(net, torch.randn(1, 3, 8, 8), out="/tmp/n.tflite")  # doctest: +SKIP
"""

from __future__ import annotations

import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bnnexport.converters.gate import RTOL
from bnnexport.errors import ConfigError, DataError
from bnnexport.run import files, provenance
from bnnexport.run.refusals import explain_refusal, gate_refusal, refusal_path
from bnnexport.stages.convert_report import ConvertReport, ConvertSettings
from bnnexport.stages.progress import Steps

if TYPE_CHECKING:
    from bnnexport.nn.discover import BinaryKernels

EXPORTERS = ("legacy", "dynamo")


MODULE_SAMPLES = 16


def convert_module(
    model: Any,
    example_input: Any,
    target: str = "arm64",
    out: str | Path = "model-arm64.tflite",
    exporter: str = "legacy",
    opset: int | None = None,
    samples: Any = MODULE_SAMPLES,
    allow_float: tuple[str, ...] = (),
    progress: bool | None = None,
    trust_twin: bool = False,
    float_layers: str = "float32",
    calibration: Any = None,
    io: str = "float32",
    input_layout: str | None = None,
) -> ConvertReport:
    """Convert any PyTorch BNN (`nn.Module`) to an LCE flatbuffer at `out`.

    Exports it to ONNX next to `out` (same name, `.onnx`) with torch's legacy exporter or, with
    `exporter="dynamo"`, the default one, checks ONNX Runtime against PyTorch, and converts it
    as `bnnexport convert MODEL.onnx` does (normalise, translate, the conversion gate), all on
    `samples`: your own inputs (an array or tensor of `example_input`'s shape but any batch), or
    a number of standard-normal inputs of that shape (the report's `random_inputs` says which).
    `allow_float`, `trust_twin`, `float_layers`, `io` and `input_layout` are `bnnexport
    convert`'s (`ConvertSettings`), `calibration` int8's inputs to calibrate on (the module
    docstring says more).

    Example:
        >>> import torch, torch.nn as nn
        >>> from bnnexport import convert_module
        >>> net = nn.Sequential(nn.Conv2d(3, 8, 3))  # any BNN, see README
        >>> x = torch.randn(1, 3, 8, 8)
        >>> report = convert_module(net, x, out="/tmp/n.tflite")  # doctest: +SKIP

    Raises:
        FidelityError (exit 1) when the exported ONNX model or the flatbuffer disagree with
        PyTorch / ONNX Runtime; the converter's errors as for `convert_run`.
    """
    from bnnexport.converters.flatbuffer import INPUT_LAYOUTS

    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {', '.join(EXPORTERS)}, got {exporter!r}")
    if input_layout not in (None, *INPUT_LAYOUTS):
        raise ValueError(f"input_layout must be nhwc, nchw or None, got {input_layout!r}")
    job = _ModuleJob(Path(out), target, exporter, opset, trust_twin)
    exported = _export_checked(model, example_input, samples, job, progress)
    shape = tuple(example_input.shape)
    settings = ConvertSettings(
        allow_float=tuple(allow_float), trust_twin=trust_twin, float_layers=float_layers, io=io,
        max_accuracy_drop=None, input_layout=input_layout, kernels=exported.kernels,
        calibration=None if calibration is None else _module_inputs(calibration, shape),
    )  # fmt: skip
    report = _convert_exported(exported, settings, job)
    if report.trusted_twin is not None:
        warnings.warn(
            f"{job.out}: the check on real weights could not decide (a degenerate model); "
            "converted on the strength of the exact-grid twin alone (report.trusted_twin)",
            stacklevel=2,
        )
    return report


@dataclass(frozen=True)
class _ModuleJob:
    """One `convert_module`: where it writes, for which target, and how it exports."""

    out: Path  # the flatbuffer
    target: str
    exporter: str  # "legacy" or "dynamo"
    opset: int | None  # None: the exporter's default
    trust_twin: bool  # a degenerate model the export check cannot decide goes on to the twin

    @property
    def onnx_path(self) -> Path:
        """Where the exported ONNX model goes: beside the flatbuffer, of the same name."""
        return self.out.with_suffix(".onnx")

    @property
    def refusal(self) -> Path:
        """Where a refusal's diagnostics go: OUT-STEM-gate-refusal.json."""
        return refusal_path(self.out, None)


@dataclass(frozen=True)
class _Exported:
    """A module exported to ONNX and checked in ONNX Runtime: what its conversion goes on with."""

    inputs: np.ndarray  # the check samples, NCHW float32
    expected: np.ndarray  # PyTorch's outputs on them
    random_inputs: bool  # whether the samples are standard-normal ones, not the user's
    kernels: BinaryKernels  # the module's record of binary kernels (empty: none, a float model)
    trusted: dict | None  # why the export check could not decide (`trust_twin`); None: it did
    steps: Steps  # the progress lines
    checked: float  # time.perf_counter() after the check: the report's `seconds` count from it


def _export_checked(
    model: Any, example_input: Any, samples: Any, job: _ModuleJob, progress: bool | None
) -> _Exported:
    """`model` exported to `job.onnx_path` and checked against PyTorch on `samples`, every file
    `job` writes checked replaceable first (never a file of the user's, whatever its name).
    FidelityError (exit 1) when ONNX Runtime disagrees, unless `job.trust_twin` lets a check
    that cannot decide go on to the twin."""
    from bnnexport.converters.errors import ConversionMismatchError, InconclusiveCheckError
    from bnnexport.stages.export import torch_outputs

    for written in (job.onnx_path, job.out, job.refusal):
        files.require_replaceable(written)
    inputs = _module_inputs(samples, tuple(example_input.shape))
    steps = Steps("convert_module", progress)
    kernels = _module_record(model, example_input)
    model = _export(model, example_input, job, steps)
    expected = torch_outputs(model, inputs)
    trusted = None
    try:
        _export_check(model, job.onnx_path, inputs, expected)
    except ConversionMismatchError as error:  # a degenerate model may go on to the twin
        if not (job.trust_twin and isinstance(error, InconclusiveCheckError)):
            raise gate_refusal(error, job.refusal, "no flatbuffer written") from None
        trusted = {**error.diagnostics, "inconclusive": str(error)}
    random_inputs = isinstance(samples, int)
    return _Exported(inputs, expected, random_inputs, kernels, trusted, steps, time.perf_counter())


def _export(model: Any, example_input: Any, job: _ModuleJob, steps: Steps) -> Any:
    """`model` in eval mode, exported to `job.onnx_path` as one self-contained file."""
    from bnnexport.stages.export import onnx_export

    steps(f"torch.onnx.export ({job.exporter}) to {job.onnx_path}")
    model = model.eval()
    kwargs: dict[str, Any] = {"dynamo": job.exporter == "dynamo"}
    if job.opset is not None:
        kwargs["opset_version"] = job.opset
    with tempfile.TemporaryDirectory(prefix="bnnexport-module-") as tmp:
        exported = Path(tmp) / job.onnx_path.name
        onnx_export(model, example_input, exported, **kwargs)
        # one self-contained file: the dynamo exporter puts the weights in NAME.onnx.data
        import onnx

        files.write_bytes_atomic(job.onnx_path, onnx.load(str(exported)).SerializeToString())
    return model


def _convert_exported(
    exported: _Exported, settings: ConvertSettings, job: _ModuleJob
) -> ConvertReport:
    """The exported module converted with `settings` through the gate on its check samples,
    recorded in its folder's manifest, and its report: LCE against ONNX Runtime as the gate
    judged it, and against PyTorch's own outputs."""
    from bnnexport.converters.errors import ConversionMismatchError
    from bnnexport.converters.gate import compare_outputs
    from bnnexport.converters.lce import convert_onnx
    from bnnexport.converters.runtimes import run_lce

    options = settings.converter_options(exported.steps)
    try:
        result = convert_onnx(job.onnx_path, job.out, target=job.target, inputs=exported.inputs,
                              options=options)  # fmt: skip
    except ConversionMismatchError as error:
        raise gate_refusal(error, job.refusal, "no flatbuffer kept") from None
    provenance.record(job.out.parent, job.out.name, [job.onnx_path.name])
    seconds = time.perf_counter() - exported.checked
    lce_vs_torch = compare_outputs(exported.expected, run_lce(result.output, exported.inputs), RTOL)
    return ConvertReport.from_result(
        result, settings, "lce", seconds, torch_argmax_agreement=lce_vs_torch.argmax_agreement,
        torch_max_abs_diff=lce_vs_torch.max_abs_diff, random_inputs=exported.random_inputs,
        trusted_twin=result.trusted_twin or exported.trusted,
    )  # fmt: skip


def _module_record(model: Any, example_input: Any) -> BinaryKernels:
    """The module's binary kernels, decided as training decides them (an empty record: it has
    none, a float model, which converts to a float flatbuffer)."""
    from bnnexport.errors import NoBinaryKernelError
    from bnnexport.nn.discover import BinaryKernels, find_binary_kernels

    try:
        return find_binary_kernels(model, example_input)
    except NoBinaryKernelError:  # decided: no binary weights (not "no record", an ONNX file's)
        return BinaryKernels((), "tracing")


def _export_check(model: Any, onnx_path: Path, inputs: np.ndarray, expected: np.ndarray) -> None:
    """ConversionMismatchError unless ONNX Runtime agrees with PyTorch (`expected`) on
    `inputs`, through the export gate with its tie replay (`bnnexport.stages.export.onnx_gate`: a
    module of your own replays through its traced binarizations, or judges predictions only
    where they cannot be traced). An InconclusiveCheckError instead when binarization inputs
    lie within rounding of zero by more than ties could explain
    (`converters.gate.inconclusive`)."""
    from bnnexport.converters.errors import ConversionMismatchError
    from bnnexport.stages.export import onnx_gate

    try:
        onnx_gate(model, onnx_path, inputs, expected)
    except ConversionMismatchError as error:
        raise explain_refusal(error, onnx_path, inputs) from None


def _module_inputs(samples: Any, shape: tuple[int, ...]) -> np.ndarray:
    """`samples` standard-normal inputs of `shape` (any batch), or the user's own samples as
    float32, checked against `shape` (DataError, one line)."""
    if isinstance(samples, int):
        if samples < 1:
            raise ConfigError(f"samples must be at least 1, got {samples}")
        rng = np.random.default_rng(0)
        return rng.standard_normal((samples, *shape[1:])).astype(np.float32)
    inputs = np.ascontiguousarray(
        samples.detach().cpu().numpy() if hasattr(samples, "detach") else samples, np.float32
    )
    if inputs.ndim != len(shape) or inputs.shape[1:] != shape[1:] or len(inputs) == 0:
        raise DataError(
            f"samples of shape {list(inputs.shape)} do not fit example_input's {list(shape)} "
            "(any batch, the same other dimensions)"
        )
    return inputs
