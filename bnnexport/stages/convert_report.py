"""What `convert_run` and `convert_module` share: the settings a model is converted and checked
with (`ConvertSettings`, the converter's options made from them in one place) and the report of
the conversion (`ConvertReport`, built once from the converter's result and those settings).

Example:
    >>> ConvertSettings(float_layers="int8", io="int8").converter_options().io
    'int8'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bnnexport.converters.choices import InputLayout, LayerPrecision
from bnnexport.converters.gate import RTOL
from bnnexport.run.samples import class_names_metadata
from bnnexport.stages.report import Report, format_value, int8_lines

if TYPE_CHECKING:
    from bnnexport.converters.gate.fallbacks import RecordedLayer
    from bnnexport.converters.lce import ConversionResult, ConvertOptions
    from bnnexport.nn.discover import BinaryKernels


@dataclass(frozen=True)
class ConvertSettings:
    """How a model is converted and checked: the choices `convert_run` and `convert_module`
    share, and what bnnexport knows of the model. Both make the converter's options
    (`converter_options`) and the report's fields these decide (`report_fields`) from it, in
    this one place.

    Example:
        >>> settings = ConvertSettings(allow_float=("all",), max_accuracy_drop=None)
        >>> settings.converter_options().allow_float, settings.report_fields()["binary_parameters"]
        (('all',), None)
    """

    # "int8": the float layers (conv, depthwise, dense) run in int8, every binary layer still
    # an `LceBconv2d` (`converters.quantize`)
    float_layers: LayerPrecision = "float32"
    # binary layers (ONNX node names, or "all") allowed to stay float: the report's
    # `float_fallbacks`
    allow_float: tuple[str, ...] = ()
    # normaliser passes to skip (`converters.normalize.REWRITES`), to see what one is for
    disabled_rewrites: tuple[str, ...] = ()
    # accept a model the real-weight check cannot decide (many binarization inputs within
    # rounding of zero) when its exact-grid twin passes: the report's `trusted_twin`
    trust_twin: bool = False
    # int8: the inputs the activation ranges are calibrated on (None: the check samples); a
    # model trained with int8 carries its ranges and needs none
    calibration: np.ndarray | None = field(default=None, compare=False)
    # int8: "int8" for int8 input and output (no QUANTIZE / DEQUANTIZE)
    io: LayerPrecision = "float32"
    # int8: refuse (exit 1) a model whose top-1 on the labelled samples is more than this many
    # points below the float model's; None: no limit
    max_accuracy_drop: float | None = 1.0
    # how the flatbuffer takes the image input: "nhwc" (what an app on the device feeds) or
    # "nchw" (PyTorch's layout); None: the target's, NHWC for both
    # (`converters.lce.DEFAULT_INPUT_LAYOUT`). The flatbuffer's metadata says which
    input_layout: InputLayout | None = None
    # the model's record of binary kernels: a run's, or `convert_module`'s tracing (empty for
    # a module it finds none in); None: no record, an ONNX file of unknown origin
    kernels: BinaryKernels | None = None
    # the classes' names in the order of the outputs, for an app: the flatbuffer's metadata
    class_names: list[str] | None = None

    def converter_options(self, on_step: Callable[[str], None] | None = None) -> ConvertOptions:
        """The converter's options: these settings, the gate's tolerance (`RTOL`), the record's
        binary layers the graph must keep (`recorded_layers`), and the class names as the
        flatbuffer's metadata."""
        from bnnexport.converters.gate import GateOptions
        from bnnexport.converters.lce import ConvertOptions

        return ConvertOptions(
            gate=GateOptions(rtol=RTOL), allow_float=self.allow_float,
            disabled_rewrites=self.disabled_rewrites, on_step=on_step, trust_twin=self.trust_twin,
            recorded_layers=recorded_layers(self.kernels), float_layers=self.float_layers,
            calibration=self.calibration, io=self.io, max_accuracy_drop=self.max_accuracy_drop,
            metadata=class_names_metadata(self.class_names), input_layout=self.input_layout,
        )  # fmt: skip

    def report_fields(self) -> dict[str, Any]:
        """What the report records of these settings: `float_layers`, `class_names` and
        `binary_parameters`, the record's count of binary weights (None: no record)."""
        binary = self.kernels.parameters if self.kernels is not None else None
        return {
            "float_layers": self.float_layers,
            "binary_parameters": binary,
            "class_names": self.class_names,
        }


def recorded_layers(kernels: BinaryKernels | None) -> tuple[RecordedLayer, ...]:
    """The recorded kernels that are binary layers LCE must run binary (their input binarized
    too), as the converter reads them (`ConvertOptions.recorded_layers`); none when there is
    no record, or for kernels named without a trace."""
    from bnnexport.converters.gate.fallbacks import RecordedLayer
    from bnnexport.converters.layer_map import TOP

    found = []
    for kernel in kernels if kernels is not None else []:
        if kernel.binary_input:
            module, _, op = kernel.layer.rpartition(": ")  # "blocks.0: conv2d"
            module = TOP if module in ("", "(model)") else module
            found.append(RecordedLayer(kernel.name, module, op, tuple(kernel.shape)))
    return tuple(found)


@dataclass
class ConvertReport(Report):
    """What `bnnexport convert` prints and writes to RUN_DIR/convert.json.

    `argmax_agreement`/`max_abs_diff` are LCE against ONNX Runtime before any sign-tie replay
    (`torch_*` against PyTorch; for an int8 model, LCE int8 against the int8 model in ONNX
    Runtime before the int8 replay, and no PyTorch); `checks` holds every comparison with
    plain and resolved numbers and its ties, `twin_checks` the exact-grid twin's (no tie
    allowed)."""

    output: str
    target: str
    format: str
    binary_layers: int
    lce_bconv2d: int
    float_conv2d: int  # float32 CONV_2D / DEPTHWISE_CONV_2D ops (int8 ones: `int8_conv2d`)
    fully_connected: int
    float_fallbacks: list[str]
    argmax_agreement: float | None  # None: not decided on real weights (`trusted_twin`)
    max_abs_diff: float | None
    tie_samples: list[int]
    tie_positions: int
    tie_largest: float
    torch_argmax_agreement: float | None
    torch_max_abs_diff: float | None
    torch_tie_samples: list[int] | None
    twin_max_abs_diff: float | None
    samples: int
    random_inputs: bool
    batch: int  # the batch the flatbuffer takes (`--batch N`)
    # how the flatbuffer takes its image input, as its metadata says ("nhwc", "nchw"; None:
    # no NCHW image input, taken as the ONNX model takes it), and its input shape so
    input_layout: str | None
    input_shape: list[int]
    onnx_bytes: int
    lce_bytes: int
    tflite_float_bytes: int | None  # None: not built (only `--format tflite` builds it)
    float_output: str | None
    seconds: float
    checks: list[dict[str, Any]] = field(default_factory=list)
    twin_checks: list[dict[str, Any]] = field(default_factory=list)
    # what the normalising front end rewrote (pass -> count), and the binarization inputs of
    # plain Signs proven zero-free on the samples (converters.normalize)
    rewrites: dict[str, int] = field(default_factory=dict)
    zero_free_signs: list[str] = field(default_factory=list)
    op_histogram: dict[str, int] = field(default_factory=dict)
    batched_copy: dict | None = None  # converters.batch.BatchedResult, with --batched-copy N
    # with --trust-twin: why the real-weight check could not decide (None: it decided)
    trusted_twin: dict | None = None
    # how many binary weights the model's record of binary kernels counts: a run's, or
    # convert_module's tracing (0: it found none, a float module); None only where there is
    # no record, an ONNX file of unknown origin (`ConvertSettings.kernels`)
    binary_parameters: int | None = None
    # what LCE's interpreter must be told to run the flatbuffer besides its defaults; {}: an
    # app's default interpreter runs it (docs/LCE_NOTES.md "Grouped convolutions")
    lce_settings: dict[str, bool] = field(default_factory=dict)
    # "int8": the float layers run in int8; `int8` then says which, how they were quantized,
    # the int8 gate's replay and the accuracy against the float model (`converters.quantize`)
    float_layers: str = "float32"
    int8: dict | None = None
    int8_conv2d: int = 0  # int8 CONV_2D / DEPTHWISE_CONV_2D ops
    # the classes' names in the order of the outputs, as the flatbuffer's metadata holds them
    class_names: list[str] | None = None
    # where the time went: "export", the export command's own seconds (RUN_DIR/export.json),
    # which `seconds` does not include; "load" (the model and the samples);
    # the converter's stages (`converters.lce.STAGES`); "batched_copy" with --batched-copy
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_result(
        cls,
        result: ConversionResult,
        settings: ConvertSettings,
        fmt: str = "lce",
        seconds: float = 0.0,
        **measured: Any,
    ) -> ConvertReport:
        """The report of `result`, converted with `settings`, built once with every field: those
        `result` shares with it taken as is (paths as text), the rest read off the gates, the
        twin, the normaliser's report (`_gate_fields`) and `settings`
        (`ConvertSettings.report_fields`); `measured`, fields a stage measured itself (its
        `stage_seconds`, a `batched_copy`, PyTorch's agreement), replace what `result` says."""
        shared = {f.name for f in fields(cls)} & {f.name for f in fields(result)} - {"seconds"}
        same = {name: getattr(result, name) for name in shared}
        same.update({k: str(v) for k, v in same.items() if isinstance(v, Path)})
        decided = {**_gate_fields(result), **settings.report_fields()}
        return cls(**{**same, **decided, "format": fmt, "seconds": seconds, **measured})

    def to_table(self) -> str:
        """The fields, one line per check (plain -> resolved), the op histogram one per line."""
        data = self.to_json()
        histogram = data.pop("op_histogram")
        int8 = data.pop("int8")
        checks = data.pop("checks") + data.pop("twin_checks")
        width = max(len(k) for k in data)
        lines = [f"{k.ljust(width)}  {_cell(k, v, int8 is not None)}" for k, v in data.items()]
        lines.append("checks (argmax agreement and max |diff|: plain -> after tie replay)")
        for c in checks:
            lines.append(
                f"  {c['candidate']} vs {c['reference']}: {c['plain_argmax_agreement']:.4g} -> "
                f"{c['argmax_agreement']:.4g}, {c['plain_max_abs_diff']:.3g} -> "
                f"{c['max_abs_diff']:.3g} (tolerance {c['tolerance']:.3g}), {_replayed(c)}, "
                f"{c['sure_changed']} of {c['sure_predictions']} sure predictions changed"
                + (f", through {c['through']}" if c.get("through") else "")
            )
        lines += int8_lines(int8)
        lines.append("op_histogram")  # (rewrites and zero_free_signs print with the fields)
        op_width = max((len(op) for op in histogram), default=0)
        lines += [f"  {op.ljust(op_width)}  {count}" for op, count in histogram.items()]
        return "\n".join(lines)


def _gate_fields(result: ConversionResult) -> dict[str, Any]:
    """The report's fields read off `result`'s gates (plain numbers: before any sign-tie
    replay; an int8 model's ONNX Runtime gate is its int8 one), its twin's and its normaliser's
    report."""
    onnx_gate, torch_gate = result.gate("ONNX Runtime"), result.gate("PyTorch")
    onnx_gate = onnx_gate or result.gate("ONNX Runtime int8", "LCE int8")  # an int8 model
    return dict(
        argmax_agreement=onnx_gate.plain_argmax_agreement if onnx_gate else None,
        max_abs_diff=onnx_gate.plain_max_abs_diff if onnx_gate else None,
        tie_samples=onnx_gate.tie_samples if onnx_gate else [],
        tie_positions=onnx_gate.tie_positions if onnx_gate else 0,
        tie_largest=onnx_gate.tie_largest if onnx_gate else 0.0,
        torch_argmax_agreement=torch_gate.plain_argmax_agreement if torch_gate else None,
        torch_max_abs_diff=torch_gate.plain_max_abs_diff if torch_gate else None,
        torch_tie_samples=torch_gate.tie_samples if torch_gate else None,
        twin_max_abs_diff=max((t.max_abs_diff for t in result.twin), default=None),
        checks=[g.to_json() for g in result.gates],
        twin_checks=[g.to_json() for g in result.twin],
        rewrites=dict(result.normalized.applied),
        zero_free_signs=sorted(result.normalized.zero_sensitive),
    )


_INT8_TIES = {
    "tie_samples": "replayed at int8 steps: one-step rounding and sign ties alike",
    "tie_positions": "binarization signs tied, of those",
}


def _replayed(check: dict[str, Any]) -> str:
    """What a check's replay took: samples that agreed only once the candidate's binarization
    signs (and, for an int8 check, its int8 activations, one step apart by rounding) were
    imposed, and how many signs it imposed against the reference's own."""
    samples, signs = len(check["tie_samples"]), check["tie_positions"]
    if "int8" in check["candidate"]:
        return f"{samples} samples replayed at int8 steps, {signs} binarization signs tied"
    return f"{samples} tie samples, {signs} tie positions"


def _cell(key: str, value: Any, int8: bool = False) -> str:
    """A field of the table; `lce_settings` says what it means for an app, an int8 model's
    `tie_samples` and `tie_positions` what its replay took."""
    if int8 and key in _INT8_TIES:
        return f"{format_value(value)} ({_INT8_TIES[key]})"
    if key != "lce_settings":
        return format_value(value)
    if not value:
        return "{} (LCE's default interpreter settings run it)"
    return f"{format_value(value)} (an app must set these: LCE's default kernels refuse it)"
