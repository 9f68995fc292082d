"""`bnnexport convert`: model.onnx -> Larq Compute Engine flatbuffer, kept only if every check
passes.

A thin stage over `converters.lce.convert_onnx` (which never imports bnnexport): it finds the
files of a run directory and hands the converter the export stage's test samples plus PyTorch
as an extra reference (`bnnexport.stages.torch_probe`: its outputs, its signs via hooks on the
binarizations, its exact-grid twin), so LCE's own outputs are compared with PyTorch on every
sample. A raw MODEL.onnx is converted to `out` (default: MODEL-arm64.tflite beside it) and
checked on random inputs against ONNX Runtime; only the flatbuffer, the manifest of its folder
(provenance.json) and, on a refusal, the gate's diagnostics are written there. A folder that
is not a run directory is refused, never written into. The report gives plain agreement
(before any sign-tie replay) beside resolved agreement for each comparison
(docs/ARCHITECTURE.md, "Conversion gate"); a run's is also written to RUN_DIR/convert.json.

Example:
    >>> from bnnexport.stages.convert import convert_run
    >>> report = convert_run("runs/demo", target="arm64")        # doctest: +SKIP
    >>> report.lce_bconv2d == report.binary_layers               # doctest: +SKIP
    True
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bnnexport.converters.choices import TARGETS
from bnnexport.converters.gate import RTOL
from bnnexport.errors import CheckpointError, ConfigError, FidelityError
from bnnexport.run import files, provenance
from bnnexport.run.directory import RunDir
from bnnexport.run.refusals import gate_refusal, refusal_path
from bnnexport.run.samples import class_names_metadata, load_samples, sample_class_names
from bnnexport.stages.progress import Steps
from bnnexport.stages.report import Report, format_value, int8_lines

if TYPE_CHECKING:
    from bnnexport.converters.batch import BatchedResult
    from bnnexport.converters.gate.checks import Reference
    from bnnexport.converters.gate.fallbacks import RecordedLayer
    from bnnexport.converters.lce import ConversionResult, ConvertOptions
    from bnnexport.nn.discover import BinaryKernels
    from bnnexport.run.checkpoint import LoadedModel


FORMATS = ("lce", "tflite")


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
    # the binary weights of the model's record (a run's, or convert_module's tracing); None
    # for an ONNX file of unknown origin
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
    # which `seconds` does not include; "load" (the model, the samples, TensorFlow's import);
    # the converter's stages (`converters.lce.STAGES`); "batched_copy" with --batched-copy
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_result(cls, result: ConversionResult, fmt: str, seconds: float) -> ConvertReport:
        """The report of `result`: every field the two share is taken as is (paths as text);
        the rest are read off the gates, the twin and the normaliser's report."""
        shared = {f.name for f in fields(cls)} & {f.name for f in fields(result)} - {"seconds"}
        same = {name: getattr(result, name) for name in shared}
        same.update({k: str(v) for k, v in same.items() if isinstance(v, Path)})
        onnx_gate, torch_gate = result.gate("ONNX Runtime"), result.gate("PyTorch")
        onnx_gate = onnx_gate or result.gate("ONNX Runtime int8", "LCE int8")  # an int8 model
        return cls(
            **same, format=fmt, seconds=seconds,
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
        )  # fmt: skip

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


def _locate(
    path: Path, target: str, batch: int, out: Path | None = None, int8: bool = False
) -> tuple[Path, Path, Path, RunDir | None]:
    """(onnx, flatbuffer, float tflite, run dir or None) for a run directory or an .onnx file.

    A raw MODEL.onnx goes to `out`, by default MODEL-TARGET.tflite beside it (with `int8`,
    MODEL-TARGET-int8.tflite, a run's model-TARGET-int8.tflite); its float model
    to OUT-STEM-float.tflite (MODEL-float.tflite by default). A flatbuffer converted at a batch
    other than 1 carries it in its default name (model-arm64-b8.tflite, the name
    `--batched-copy 8` gives the same model), so two batches never share one file."""
    from bnnexport.converters.batch import batched_path

    if path.is_dir():
        if out is not None:
            raise ConfigError(
                f"--out names where a MODEL.onnx is converted to; {path} is a folder, and a run "
                f"directory's flatbuffer is always {RunDir(path).flatbuffer(target)} (what "
                "bench reads)"
            )
        run = _require_run(path)
        onnx_path, output, float_output = (
            run.onnx, run.flatbuffer(target, int8), run.root / "model-float.tflite"
        )  # fmt: skip
    elif path.is_file():
        run, stem = None, path.with_suffix("")
        onnx_path, output = path, Path(f"{stem}-{target}{'-int8' if int8 else ''}.tflite")
        float_output = Path(f"{stem}-float.tflite")
        if out is not None:
            output = _require_tflite_name(out)
            float_output = output.with_name(f"{output.stem}-float.tflite")
    else:
        raise CheckpointError(f"no such run directory or ONNX file: {path}")
    if batch != 1:
        _require_dynamic_batch(onnx_path, batch)
        if out is None:
            output, float_output = batched_path(output, batch), batched_path(float_output, batch)
    return onnx_path, output, float_output, run


def _require_run(path: Path) -> RunDir:
    """`path` as a run directory ready to convert: bnnexport's checkpoint.pt, model.onnx and
    samples.npz (what train and export leave). Anything else is refused before a file is
    written into it: a folder of the user's own is not bnnexport's to fill."""
    run = RunDir(path)
    if not run.checkpoint.is_file():
        raise CheckpointError(
            f"{path} is not a bnnexport run directory (no checkpoint.pt), so convert writes "
            "nothing into it: give a run directory, or convert an ONNX file with "
            f"`bnnexport convert MODEL.onnx [--out FILE.tflite]`"
        )
    if not run.onnx.is_file():
        raise CheckpointError(f"{path} has no model.onnx: run `bnnexport export {path}` first")
    return run


def _require_tflite_name(out: Path) -> Path:
    """`--out` as a flatbuffer's path: ConfigError unless it ends in .tflite."""
    if out.suffix != ".tflite" or out.name == ".tflite":
        raise ConfigError(f"--out {out}: name a .tflite file (e.g. net-arm64.tflite)")
    return out


def _require_dynamic_batch(onnx_path: Path, batch: int) -> None:
    """ConfigError when --batch N cannot apply: the model's batch dimension is fixed."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    constants = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name in constants or not dims:
            continue
        if dims[0].HasField("dim_value") and dims[0].dim_value > 0:
            raise ConfigError(
                f"--batch {batch}: {onnx_path} takes a fixed batch of {dims[0].dim_value} "
                f"(input {value.name!r}); --batch applies only to a dynamic batch dimension, "
                "`--batched-copy N` converts a run at batch N"
            )


def convert_run(
    path: str | Path,
    target: str = "arm64",
    fmt: str = "lce",
    samples: int | None = None,
    allow_float: tuple[str, ...] = (),
    batched_copy: int | None = None,
    batch: int = 1,
    disabled_rewrites: tuple[str, ...] = (),
    progress: bool | None = None,
    trust_twin: bool = False,
    out: str | Path | None = None,
    float_layers: str | None = None,
    calibration_samples: str | Path | None = None,
    io: str = "float32",
    max_accuracy_drop: float | None = 1.0,
    input_layout: str | None = None,
) -> ConvertReport:
    """Convert a run's model.onnx (or any MODEL.onnx) to an LCE flatbuffer for `target`.

    Args:
        path: a run directory (with checkpoint.pt, after `bnnexport export`) or an ONNX file.
        target: "arm64" or "arm32" (the same LCE target "arm"; only the file name differs).
        fmt: "lce", or "tflite" to also write a float TFLite model (model-float.tflite).
        samples: check on only the first N samples of samples.npz (None = all).
        allow_float: binary layers (ONNX node names, or "all") allowed to stay float; they
            are listed in the report's `float_fallbacks`.
        batched_copy: also write MODEL-TARGET-bN.tflite, converted at batch N (`converters.batch`).
        batch: the batch size fixed in place of a dynamic batch dimension; the flatbuffer,
            MODEL-TARGET-bN.tflite, is converted as the batched copy is (`converters.batch`).
        disabled_rewrites: normaliser passes to skip (`converters.normalize.REWRITES`), to see
            what one is for.
        progress: step lines on stderr (None: only when stderr is a terminal).
        trust_twin: accept a model the real-weight check cannot decide (many binarization
            inputs within rounding of zero) when its exact-grid twin passes; recorded in the
            report's `trusted_twin`.
        out: where the flatbuffer of an ONNX file goes (a .tflite path; default
            MODEL-TARGET.tflite beside it, or MODEL-TARGET-bN.tflite at `batch` N). Its folder
            also gets provenance.json, with `fmt` "tflite" OUT-STEM-float.tflite
            (MODEL-float.tflite by default), with `batched_copy` OUT-STEM-bN.tflite, and on a
            refusal OUT-STEM-gate-refusal.json; not for a run directory (ConfigError).
        float_layers: "float32", or "int8": the float layers (conv, depthwise, dense) run in
            int8, binary layers stay `LceBconv2d` (`converters.quantize`); written to
            model-TARGET-int8.tflite (MODEL-TARGET-int8.tflite beside an ONNX file) and
            RUN_DIR/convert-int8.json, beside the float32 ones. None: the run's own (int8 for
            a run trained with `--float-layers int8`), else float32.
        calibration_samples: int8: a samples file (.npz with `inputs`) to calibrate the
            activation ranges on; default the run's samples (the check samples of an ONNX
            file). A model trained with int8 carries its ranges and needs none.
        io: int8: "int8" for int8 input and output (no QUANTIZE / DEQUANTIZE at the ends).
        max_accuracy_drop: int8: refuse (exit 1) a model whose top-1 on the run's labelled
            samples is more than this many points below the float model's; None: no limit.
        input_layout: how the flatbuffer takes the image input: "nhwc" (what an app on the
            device feeds) or "nchw" (PyTorch's layout); None: the target's, NHWC for both
            (`converters.lce.DEFAULT_INPUT_LAYOUT`). The flatbuffer's metadata says which.

    Raises:
        FidelityError (exit 1) when the flatbuffer disagrees with ONNX Runtime or PyTorch
        (diagnostics in RUN_DIR/gate-refusal.json, or OUT-STEM-gate-refusal.json beside the
        flatbuffer); FloatFallbackError (exit 1) when a binary layer would stay float;
        UnsupportedOpError, InvalidModelError, CheckpointError (a folder that is not a run
        directory), ForeignFileError (a file of the user's in the way), ConfigError (exit 2).
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    start = time.perf_counter()
    float_layers = float_layers or _recorded_float_layers(Path(path))
    int8 = float_layers == "int8"
    onnx_path, output, float_output, run = _locate(
        Path(path), target, batch, None if out is None else Path(out), int8
    )
    if run is not None:
        provenance.require_current(run.root, "model.onnx", f": run `bnnexport export {run.root}`")
    outputs = _outputs(output, float_output if fmt == "tflite" else None, batched_copy, run)
    report_name = "convert-int8.json" if int8 else "convert.json"
    outputs = [o.with_name(report_name) if o.name == "convert.json" else o for o in outputs]
    refusal = refusal_path(output, run)
    for written in [*outputs, refusal]:  # before any work: a file of the user's is never replaced
        files.require_replaceable(written)
    loaded = _model_of(run)
    inputs, labels, references = _checks_of(run, onnx_path, samples, loaded)
    kernels = loaded.kernels if loaded is not None else None
    names = sample_class_names(run) if run is not None else None  # for an app: the labels
    if int8:  # the int8 model is checked against its own quantized reference, not PyTorch's
        references = []

    from bnnexport.converters.batch import convert_batched
    from bnnexport.converters.errors import ConversionMismatchError
    from bnnexport.converters.gate import GateOptions
    from bnnexport.converters.lce import ConvertOptions, convert_onnx

    options = ConvertOptions(
        gate=GateOptions(rtol=RTOL), allow_float=tuple(allow_float),
        disabled_rewrites=tuple(disabled_rewrites), on_step=Steps("convert", progress),
        trust_twin=trust_twin, recorded_layers=recorded_layers(kernels),
        float_layers=float_layers, calibration=_calibration(calibration_samples), io=io,
        max_accuracy_drop=max_accuracy_drop, metadata=class_names_metadata(names),
        input_layout=input_layout,
    )  # fmt: skip
    convert = convert_onnx if batch == 1 else functools.partial(convert_batched, batch=batch)
    loaded = time.perf_counter()  # the model, the samples and TensorFlow's import: "load"
    try:
        result = convert(
            onnx_path, output, target=target, inputs=inputs, options=options,
            write_float_tflite=float_output if fmt == "tflite" else None, references=references,
            labels=labels,
        )  # fmt: skip
    except ConversionMismatchError as error:
        raise gate_refusal(error, refusal, "no flatbuffer kept") from None
    if refusal.is_file():  # an earlier refusal's diagnostics no longer describe this model
        files.remove([refusal])
    copy, copied = None, time.perf_counter()
    if batched_copy is not None:  # model-TARGET-bN.tflite for accuracy on a device, same gate
        if int8:  # the same int8 model: the batch-1 conversion's ranges, not calibrated again
            options = replace(options, int8_points=result.int8["tensor_points"])
        copy = _batched_copy(onnx_path, output, batched_copy, target, inputs, options, references)
    report = ConvertReport.from_result(result, fmt, time.perf_counter() - start)
    report.stage_seconds = {
        **_export_seconds(run), "load": round(loaded - start, 3), **result.stage_seconds,
        **({"batched_copy": round(time.perf_counter() - copied, 3)} if copy else {}),
    }  # fmt: skip
    report.float_layers = float_layers
    report.batched_copy = copy.to_json() if copy is not None else None
    report.binary_parameters = kernels.parameters if kernels is not None else None
    report.class_names = names
    if report.trusted_twin is not None:  # never silent, whatever the output format
        options.step("accepted on the exact-grid twin alone (--trust-twin): see trusted_twin")
    for written in outputs:
        if written.suffix == ".tflite" and written.is_file():
            # the source by its path from the flatbuffer's folder, so `bench OUT.tflite` finds
            # the ONNX model it was made from wherever --out put it
            source = os.path.relpath(onnx_path, written.parent)
            provenance.record(written.parent, written.name, [source])
    if run is not None:
        report.save(run.root / report_name)
    return report


def _export_seconds(run: RunDir | None) -> dict[str, float]:
    """{"export": the seconds RUN_DIR/export.json records}, or {} (an ONNX file, no record)."""
    import json

    path = run.root / "export.json" if run is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        return {"export": round(float(json.loads(path.read_text())["seconds"]), 3)}
    except (ValueError, KeyError, TypeError):  # an unreadable record: no figure
        return {}


def _model_of(run: RunDir | None) -> LoadedModel | None:
    """The run's model with its record of binary kernels (None: a raw ONNX file, or a run
    without its checkpoint)."""
    if run is None or not run.checkpoint.is_file():
        return None
    from bnnexport.run.checkpoint import open_model

    return open_model(run.root)


def _checks_of(
    run: RunDir | None, onnx_path: Path, samples: int | None, loaded: LoadedModel | None
) -> tuple[np.ndarray | None, np.ndarray | None, list[Reference]]:
    """The gate's inputs and their labels (a run's samples; None for an ONNX file: the
    converter draws random inputs) and the references besides ONNX Runtime (PyTorch, for a
    run)."""
    if run is None:
        return None, None, []
    from bnnexport.stages.export import torch_outputs
    from bnnexport.stages.torch_probe import torch_reference

    inputs, labels = load_samples(run, samples)
    if loaded is None:
        return inputs, labels, []
    model = loaded.model
    outputs = functools.partial(torch_outputs, model)
    return inputs, labels, [torch_reference(model, onnx_path, inputs[0], outputs)]


def _calibration(path: str | Path | None) -> np.ndarray | None:
    """The inputs of a calibration samples file (`--calibration-samples`), None without one;
    CheckpointError (one line) for a file that is not a samples archive."""
    if path is None:
        return None
    from bnnexport.run.samples import read_samples_file

    inputs, _labels = read_samples_file(path, hint="--calibration-samples takes an .npz "
                                        "with an `inputs` array (NCHW float32)")  # fmt: skip
    return inputs


def _recorded_float_layers(path: Path) -> str:
    """How the run at `path` trained its float layers ("int8": quantization-aware, its
    model.onnx carries the ranges), else "float32" (an ONNX file, an older run)."""
    from bnnexport.run.checkpoint import recorded_float_layers

    return recorded_float_layers(path) if path.is_dir() else "float32"


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


def _batched_copy(
    onnx_path: Path,
    output: Path,
    batch: int,
    target: str,
    inputs: np.ndarray | None,
    options: ConvertOptions,
    references: list[Reference],
) -> BatchedResult:
    """MODEL-TARGET-bN.tflite through the same gate; FidelityError (exit 1) if it fails."""
    from bnnexport.converters.batch import BatchedResult, batched_path, convert_batched
    from bnnexport.converters.errors import ConversionMismatchError

    options.step(f"batch-{batch} copy for the device")
    try:
        copy = convert_batched(
            onnx_path, batched_path(output, batch), batch, target, inputs, options, references
        )
        return BatchedResult.of(copy)
    except ConversionMismatchError as error:
        raise FidelityError(f"batch-{batch} copy: {error}; no copy kept") from None


def convert_batched_copy(
    run_dir: str | Path, target: str, batch: int, progress: bool | None = None, int8: bool = False
) -> Path:
    """Convert only RUN_DIR's batch-`batch` copy (model-TARGET-bN.tflite), through the same gate
    as `convert --batched-copy`: what `bench --device` needs for accuracy on the device. With
    `int8`, the int8 flatbuffer's (model-TARGET-int8-bN.tflite), quantized with the ranges its
    convert-int8.json records. Returns its path; FidelityError (exit 1) when the gate refuses
    it."""
    from bnnexport.converters.batch import batched_path
    from bnnexport.converters.flatbuffer import input_layout
    from bnnexport.converters.gate import GateOptions
    from bnnexport.converters.lce import ConvertOptions

    run = RunDir(run_dir)
    onnx_path, output, _float, _run = _locate(run.root, target, 1, int8=int8)
    provenance.require_current(run.root, "model.onnx", f": run `bnnexport export {run.root}`")
    copy = batched_path(output, batch)
    files.require_replaceable(copy)
    loaded = _model_of(run)
    inputs, _labels, references = _checks_of(run, onnx_path, None, loaded)
    options = ConvertOptions(
        gate=GateOptions(rtol=RTOL), on_step=Steps("bench", progress),
        recorded_layers=recorded_layers(loaded.kernels if loaded else None),
        input_layout=input_layout(output) if output.is_file() else None,  # the batch-1's
    )  # fmt: skip
    if int8:  # the same int8 model as the batch-1 flatbuffer
        recorded = _int8_record(run, output)
        options = replace(options, float_layers="int8", max_accuracy_drop=None,
                          int8_points=recorded["tensor_points"], io=recorded["io"])  # fmt: skip
        references = []
    _batched_copy(onnx_path, output, batch, target, inputs, options, references)
    provenance.record(run.root, copy.name, ["model.onnx"])
    return copy


def _int8_record(run: RunDir, flatbuffer: Path) -> dict[str, Any]:
    """The `int8` part of RUN_DIR/convert-int8.json, which made `flatbuffer`; CheckpointError
    (one line) when it is missing or describes another conversion."""
    import json

    path = run.root / "convert-int8.json"
    hint = f": run `bnnexport convert {run.root} --float-layers int8` again"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        raise CheckpointError(f"{path} is missing or unreadable{hint}") from None
    if Path(str(report.get("output"))).name != flatbuffer.name or not report.get("int8"):
        raise CheckpointError(f"{path} does not describe {flatbuffer.name}{hint}")
    return report["int8"]


def _outputs(
    output: Path, float_output: Path | None, batched_copy: int | None, run: RunDir | None
) -> list[Path]:
    """Every file a conversion may write besides its folder's provenance.json (the manifest)
    and a refusal's diagnostics: the flatbuffer(s), the batched copy, a run's convert.json."""
    from bnnexport.converters.batch import batched_path

    written = [output] + ([float_output] if float_output is not None else [])
    if batched_copy is not None:
        written.append(batched_path(output, batched_copy))
    if run is not None:
        written.append(run.root / "convert.json")
    return written
