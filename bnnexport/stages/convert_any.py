"""`convert_module(model, example_input) -> ConvertReport`: any PyTorch BNN (`nn.Module`) to an LCE
flatbuffer, in one call.

It decides the module's binary kernels as training does (`bnnexport.nn.discover`), exports it to
ONNX beside the output, checks ONNX Runtime against PyTorch, and converts through the same gate
as `bnnexport convert` (`bnnexport.stages.convert`), on your samples or random inputs of its shape.

Example:
    >>> import torch, torch.nn as nn
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3))  # any BNN, see README
    >>> report = convert_module(net, torch.randn(1, 3, 8, 8), out="/tmp/n.tflite")  # doctest: +SKIP
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bnnexport.converters.gate import RTOL
from bnnexport.errors import ConfigError, DataError
from bnnexport.run import files, provenance
from bnnexport.run.refusals import explain_refusal, gate_refusal, refusal_path
from bnnexport.stages.progress import Steps

if TYPE_CHECKING:
    from bnnexport.nn.discover import BinaryKernels
from bnnexport.stages.convert import ConvertReport, recorded_layers

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
    `exporter="dynamo"`, the default one; then the same path as `bnnexport convert MODEL.onnx`:
    normalise, translate, and the conversion gate, on `samples`: your own inputs (an array or
    tensor of `example_input`'s shape but any batch), or a number of standard-normal inputs of
    that shape (the report's `random_inputs` says which; ONNX Runtime on the exported file is
    the reference). PyTorch's own
    outputs on those inputs are compared with ONNX Runtime's (the export check: the gate of
    `bnnexport export`, with its tie replay, through the module's traced binarizations for a
    module of your own) and reported as `torch_argmax_agreement`. A
    model whose binarization inputs lie within rounding of zero by the thousand (BatchNorm with
    its default statistics) cannot be checked on real weights: the error says so, and
    `trust_twin=True` converts it on the strength of the exact-grid twin (`trusted_twin` in
    the report). On any refusal the gate's diagnostics go to OUT-STEM-gate-refusal.json.

    With `float_layers="int8"` the float layers run in int8 (`bnnexport convert --float-layers
    int8`): calibrated on `calibration` (inputs of `example_input`'s shape, any batch), else on
    `samples`; the flatbuffer is checked against the same int8 model in ONNX Runtime, and
    `torch_argmax_agreement` is its agreement with the float module. `io="int8"` gives it int8
    input and output.

    An image input (N, C, H, W in PyTorch) is taken as `input_layout` says: "nhwc" (channels
    last, what an app on the device feeds) or "nchw"; None: the target's, NHWC
    (`bnnexport convert --input-layout`). `samples` stay NCHW, as the module takes them.

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
    from bnnexport.converters.gate import compare
    from bnnexport.converters.runtimes import run_lce
    from bnnexport.stages.export import onnx_export, torch_outputs

    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {', '.join(EXPORTERS)}, got {exporter!r}")
    if input_layout not in (None, *INPUT_LAYOUTS):
        raise ValueError(f"input_layout must be nhwc, nchw or None, got {input_layout!r}")
    out = Path(out)
    onnx_path = out.with_suffix(".onnx")
    refusal = refusal_path(out, None)
    for written in (onnx_path, out, refusal):  # never a file of the user's, whatever its name
        files.require_replaceable(written)
    inputs = _module_inputs(samples, tuple(example_input.shape))
    steps = Steps("convert_module", progress)
    kernels = _module_record(model, example_input)
    steps(f"torch.onnx.export ({exporter}) to {onnx_path}")
    model = model.eval()
    kwargs: dict[str, Any] = {"dynamo": exporter == "dynamo"}
    if opset is not None:
        kwargs["opset_version"] = opset
    with tempfile.TemporaryDirectory(prefix="bnnexport-module-") as tmp:
        exported = Path(tmp) / onnx_path.name
        onnx_export(model, example_input, exported, **kwargs)
        # one self-contained file: the dynamo exporter puts the weights in NAME.onnx.data
        import onnx

        files.write_bytes_atomic(onnx_path, onnx.load(str(exported)).SerializeToString())
    expected = torch_outputs(model, inputs)
    from bnnexport.converters.errors import ConversionMismatchError, InconclusiveCheckError
    from bnnexport.converters.gate import GateOptions
    from bnnexport.converters.lce import ConvertOptions, convert_onnx

    trusted = None
    try:
        _export_check(model, onnx_path, inputs, expected)
    except ConversionMismatchError as error:  # a degenerate model may go on to the twin
        if not (trust_twin and isinstance(error, InconclusiveCheckError)):
            raise gate_refusal(error, refusal, "no flatbuffer written") from None
        trusted = {**error.diagnostics, "inconclusive": str(error)}
    start = time.perf_counter()
    shape = tuple(example_input.shape)
    options = ConvertOptions(
        gate=GateOptions(rtol=RTOL), allow_float=tuple(allow_float), on_step=steps,
        trust_twin=trust_twin, recorded_layers=recorded_layers(kernels),
        float_layers=float_layers, io=io, max_accuracy_drop=None,
        calibration=None if calibration is None else _module_inputs(calibration, shape),
        input_layout=input_layout,
    )  # fmt: skip
    try:
        result = convert_onnx(onnx_path, out, target=target, inputs=inputs, options=options)
    except ConversionMismatchError as error:
        raise gate_refusal(error, refusal, "no flatbuffer kept") from None
    provenance.record(out.parent, out.name, [onnx_path.name])
    report = ConvertReport.from_result(result, "lce", time.perf_counter() - start)
    report.float_layers = float_layers
    lce_vs_torch = compare(expected, run_lce(result.output, inputs), RTOL)
    report.torch_argmax_agreement = lce_vs_torch.argmax_agreement
    report.torch_max_abs_diff = lce_vs_torch.max_abs_diff
    report.random_inputs = isinstance(samples, int)
    report.binary_parameters = kernels.parameters if kernels is not None else 0
    report.trusted_twin = report.trusted_twin or trusted
    if report.trusted_twin is not None:
        warnings.warn(
            f"{out}: the check on real weights could not decide (a degenerate model); "
            "converted on the strength of the exact-grid twin alone (report.trusted_twin)",
            stacklevel=2,
        )
    return report


def _module_record(model: Any, example_input: Any) -> BinaryKernels | None:
    """The module's binary kernels, decided as training decides them (None: it has none, a
    float model, which converts to a float flatbuffer)."""
    from bnnexport.errors import NoBinaryKernelError
    from bnnexport.nn.discover import find_binary_kernels

    try:
        return find_binary_kernels(model, example_input)
    except NoBinaryKernelError:
        return None


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
