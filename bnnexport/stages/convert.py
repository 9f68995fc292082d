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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from bnnexport.converters.choices import TARGETS
from bnnexport.errors import CheckpointError, ConfigError, FidelityError
from bnnexport.run import files, provenance
from bnnexport.run.directory import RunDir
from bnnexport.run.refusals import gate_refusal, refusal_path
from bnnexport.run.samples import load_samples, sample_class_names
from bnnexport.stages.convert_report import ConvertReport, ConvertSettings
from bnnexport.stages.progress import Steps

if TYPE_CHECKING:
    from bnnexport.converters.batch import BatchedResult
    from bnnexport.converters.gate.checks import Reference
    from bnnexport.converters.lce import ConversionResult, ConvertOptions
    from bnnexport.run.checkpoint import LoadedModel


FORMATS = ("lce", "tflite")


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
        batched_copy: also write MODEL-TARGET-bN.tflite, converted at batch N (`converters.batch`).
        batch: the batch fixed in place of a dynamic batch dimension; the flatbuffer is then
            MODEL-TARGET-bN.tflite, converted as the batched copy is.
        progress: step lines on stderr (None: only when stderr is a terminal).
        out: where an ONNX file's flatbuffer goes (default MODEL-TARGET.tflite beside it); its
            folder also gets provenance.json and, as asked, OUT-STEM-float.tflite,
            OUT-STEM-bN.tflite and OUT-STEM-gate-refusal.json. Not for a run directory.
        float_layers: as `ConvertSettings.float_layers` (int8: model-TARGET-int8.tflite and
            convert-int8.json); None: the run's own, else float32.
        calibration_samples: int8: a samples file (.npz with `inputs`) to calibrate on.
        allow_float, disabled_rewrites, trust_twin, io, max_accuracy_drop, input_layout: as
            the fields of `ConvertSettings` of the same names.

    Raises:
        FidelityError (exit 1) when the flatbuffer disagrees with ONNX Runtime or PyTorch
        (diagnostics in RUN_DIR/gate-refusal.json, or OUT-STEM-gate-refusal.json beside the
        flatbuffer); FloatFallbackError (exit 1) when a binary layer would stay float;
        UnsupportedOpError, InvalidModelError, CheckpointError (a folder that is not a run
        directory), ForeignFileError (a file of the user's in the way), ConfigError (exit 2).
    """
    job = _plan(Path(path), out, target, fmt, batch, batched_copy, float_layers)
    loaded = _model_of(job.run)
    checks = _checks_of(job.run, job.onnx_path, samples, loaded)
    if job.int8:  # the int8 model is checked against its own quantized reference, not PyTorch's
        checks = checks._replace(references=[])
    settings = ConvertSettings(
        float_layers=job.float_layers, allow_float=tuple(allow_float),
        disabled_rewrites=tuple(disabled_rewrites), trust_twin=trust_twin,
        calibration=_calibration(calibration_samples), io=io,
        max_accuracy_drop=max_accuracy_drop, input_layout=input_layout,
        kernels=loaded.kernels if loaded is not None else None,
        class_names=sample_class_names(job.run) if job.run is not None else None,  # for an app
    )  # fmt: skip
    return _convert(job, settings, checks, Steps("convert", progress))


@dataclass(frozen=True)
class _Job:
    """One `convert_run`: what it converts to what, and so every file it may write."""

    target: str
    fmt: str
    batch: int  # the flatbuffer's (`--batch`)
    batched_copy: int | None  # the batched copy's batch (`--batched-copy`), None: no copy
    float_layers: str
    onnx_path: Path
    output: Path
    float_output: Path | None  # the float TFLite model, with `fmt` "tflite" only
    run: RunDir | None  # None: an ONNX file
    started: float  # time.perf_counter() as it was planned: the report's `seconds` count from it

    @property
    def int8(self) -> bool:
        """Whether the float layers run in int8."""
        return self.float_layers == "int8"

    @property
    def report_name(self) -> str:
        """A run's report: convert.json, or convert-int8.json beside it for the int8 model."""
        return "convert-int8.json" if self.int8 else "convert.json"

    @property
    def refusal(self) -> Path:
        """Where a refusal's diagnostics go (`bnnexport.run.refusals.refusal_path`)."""
        return refusal_path(self.output, self.run)

    @property
    def outputs(self) -> list[Path]:
        """Every file it may write besides its folder's provenance.json (the manifest) and a
        refusal's diagnostics: the flatbuffer(s), the batched copy, a run's report."""
        from bnnexport.converters.batch import batched_path

        written = [self.output] + ([self.float_output] if self.float_output is not None else [])
        if self.batched_copy is not None:
            written.append(batched_path(self.output, self.batched_copy))
        if self.run is not None:
            written.append(self.run.root / self.report_name)
        return written


def _plan(
    path: Path,
    out: str | Path | None,
    target: str,
    fmt: str,
    batch: int,
    batched_copy: int | None,
    float_layers: str | None,
) -> _Job:
    """`convert_run`'s job (`_locate` says where each file goes), every file it may write
    checked before any work: a file of the user's is never replaced, and a run's model.onnx
    must be current."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    started = time.perf_counter()
    float_layers = float_layers or _recorded_float_layers(path)
    out = None if out is None else Path(out)
    onnx_path, output, float_output, run = _locate(path, target, batch, out, float_layers == "int8")
    if run is not None:
        provenance.require_current(run.root, "model.onnx", f": run `bnnexport export {run.root}`")
    job = _Job(
        target, fmt, batch, batched_copy, float_layers, onnx_path, output,
        float_output if fmt == "tflite" else None, run, started,
    )  # fmt: skip
    for written in [*job.outputs, job.refusal]:
        files.require_replaceable(written)
    return job


def _convert(job: _Job, settings: ConvertSettings, checks: _Checks, steps: Steps) -> ConvertReport:
    """`job` done with `settings`, checked on `checks`: the flatbuffer (and its batched copy)
    kept only when the gate passes, recorded in its folder's manifest; the report, saved as a
    run's convert.json."""
    options = settings.converter_options(steps)
    loaded = time.perf_counter()  # the model and the samples: "load"
    result = _gated(job, options, checks)
    copied = time.perf_counter()
    copy = _copy_of(job, options, checks, result)
    stage_seconds = {
        **_export_seconds(job.run), "load": round(loaded - job.started, 3), **result.stage_seconds,
        **({"batched_copy": round(time.perf_counter() - copied, 3)} if copy else {}),
    }  # fmt: skip
    report = ConvertReport.from_result(
        result, settings, job.fmt, time.perf_counter() - job.started, stage_seconds=stage_seconds,
        batched_copy=copy.to_json() if copy is not None else None,
    )  # fmt: skip
    if report.trusted_twin is not None:  # never silent, whatever the output format
        options.step("accepted on the exact-grid twin alone (--trust-twin): see trusted_twin")
    for written in job.outputs:
        if written.suffix == ".tflite" and written.is_file():
            # the source by its path from the flatbuffer's folder, so `bench OUT.tflite` finds
            # the ONNX model it was made from wherever --out put it
            source = os.path.relpath(job.onnx_path, written.parent)
            provenance.record(written.parent, written.name, [source])
    if job.run is not None:
        report.save(job.run.root / job.report_name)
    return report


def _gated(job: _Job, options: ConvertOptions, checks: _Checks) -> ConversionResult:
    """`job`'s flatbuffer (at `job.batch`) through the gate; a refusal is FidelityError (exit
    1) with its diagnostics at `job.refusal`, a pass removes an earlier refusal's."""
    from bnnexport.converters.batch import convert_batched
    from bnnexport.converters.errors import ConversionMismatchError
    from bnnexport.converters.lce import convert_onnx

    convert = (
        convert_onnx if job.batch == 1 else functools.partial(convert_batched, batch=job.batch)
    )
    try:
        result = convert(
            job.onnx_path, job.output, target=job.target, inputs=checks.inputs, options=options,
            write_float_tflite=job.float_output, references=checks.references,
            labels=checks.labels,
        )  # fmt: skip
    except ConversionMismatchError as error:
        raise gate_refusal(error, job.refusal, "no flatbuffer kept") from None
    if job.refusal.is_file():  # an earlier refusal's diagnostics no longer describe this model
        files.remove([job.refusal])
    return result


def _copy_of(
    job: _Job, options: ConvertOptions, checks: _Checks, result: ConversionResult
) -> BatchedResult | None:
    """`job`'s batched copy, model-TARGET-bN.tflite for accuracy on a device, through the same
    gate (None: none asked for)."""
    if job.batched_copy is None:
        return None
    if job.int8:  # the same int8 model: the batch-1 conversion's ranges, not calibrated again
        options = replace(options, int8_points=result.int8["tensor_points"])
    return _batched_copy(job.onnx_path, job.output, job.batched_copy, job.target, checks.inputs,
                         options, checks.references)  # fmt: skip


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
    from bnnexport.run.checkpoint import open_run_model

    return open_run_model(run.root)


class _Checks(NamedTuple):
    """What the gate checks a conversion on: the inputs and their labels (a run's samples;
    None for an ONNX file: the converter draws random inputs), and the references besides ONNX
    Runtime (PyTorch, for a run)."""

    inputs: np.ndarray | None
    labels: np.ndarray | None
    references: list[Reference]


def _checks_of(
    run: RunDir | None, onnx_path: Path, samples: int | None, loaded: LoadedModel | None
) -> _Checks:
    """What the gate checks `run`'s model on: its first `samples` samples, and PyTorch."""
    if run is None:
        return _Checks(None, None, [])
    from bnnexport.stages.export import torch_outputs
    from bnnexport.stages.torch_probe import torch_reference

    inputs, labels = load_samples(run, samples)
    if loaded is None:
        return _Checks(inputs, labels, [])
    model = loaded.model
    outputs = functools.partial(torch_outputs, model)
    return _Checks(inputs, labels, [torch_reference(model, onnx_path, inputs[0], outputs)])


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

    run = RunDir(run_dir)
    onnx_path, output, _float, _run = _locate(run.root, target, 1, int8=int8)
    provenance.require_current(run.root, "model.onnx", f": run `bnnexport export {run.root}`")
    copy = batched_path(output, batch)
    files.require_replaceable(copy)
    loaded = _model_of(run)
    inputs, _labels, references = _checks_of(run, onnx_path, None, loaded)
    settings = ConvertSettings(
        kernels=loaded.kernels if loaded else None,
        input_layout=input_layout(output) if output.is_file() else None,  # the batch-1's
    )
    options = settings.converter_options(Steps("bench", progress))
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
