"""`bnnexport convert`: model.onnx -> Larq Compute Engine flatbuffer, checked three ways.

A thin stage over `converters.lce.convert_onnx` (which never imports bnnexport): it finds the
files of a run directory, feeds the export stage's test samples to the fidelity gate (LCE's
interpreter vs ONNX Runtime), compares the flatbuffer with PyTorch as well, and writes
RUN_DIR/convert.json. A raw MODEL.onnx is converted next to itself (MODEL-arm64.tflite) and
checked on random inputs. Samples on which a runtime parts from ONNX Runtime only at a sign tie
(`converters.ties`) are listed in `sign_ties` and left out of the comparison with PyTorch.

Example:
    >>> from bnnexport.convert import convert_run
    >>> report = convert_run("runs/demo", target="arm64")        # doctest: +SKIP
    >>> report.lce_bconv2d == report.binary_layers               # doctest: +SKIP
    True
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bnnexport.errors import CheckpointError, FidelityError
from bnnexport.reports import Report, format_value
from bnnexport.runs import RunDir

if TYPE_CHECKING:
    from converters.lce import ConversionResult
    from converters.validate import Agreement

TARGETS = ("arm64", "arm32")
FORMATS = ("lce", "tflite")
RTOL = 1e-4  # max |diff| allowed, as a fraction of the logit range


@dataclass
class ConvertReport(Report):
    """What `bnnexport convert` prints and writes to RUN_DIR/convert.json."""

    output: str
    target: str
    format: str
    binary_layers: int
    lce_bconv2d: int
    float_conv2d: int
    fully_connected: int
    argmax_agreement: float
    max_abs_diff: float
    torch_argmax_agreement: float | None
    torch_max_abs_diff: float | None
    torch_samples: int | None  # samples compared with PyTorch: those without its own tie
    samples: int
    random_inputs: bool
    onnx_bytes: int
    lce_bytes: int
    tflite_float_bytes: int
    float_output: str | None
    seconds: float
    op_histogram: dict[str, int] = field(default_factory=dict)
    sign_ties: list[int] = field(default_factory=list)
    sign_tie_largest: float = 0.0
    batch_twin: dict | None = None  # converters.batch.TwinResult, with --batch-twin N

    def to_table(self) -> str:
        """The fields, then the flatbuffer's op histogram one op per line (never truncated)."""
        data = self.to_json()
        histogram = data.pop("op_histogram")
        width = max(len(k) for k in data)
        lines = [f"{k.ljust(width)}  {format_value(v)}" for k, v in data.items()]
        lines.append("op_histogram")
        op_width = max((len(op) for op in histogram), default=0)
        lines += [f"  {op.ljust(op_width)}  {count}" for op, count in histogram.items()]
        return "\n".join(lines)


def _locate(path: Path, target: str) -> tuple[Path, Path, Path, RunDir | None]:
    """(onnx, flatbuffer, float tflite, run dir or None) for a run directory or an .onnx file."""
    if path.is_dir():
        run = RunDir(path)
        if not run.onnx.is_file():
            raise CheckpointError(f"{path} has no model.onnx: run `bnnexport export {path}` first")
        return run.onnx, run.flatbuffer(target), run.root / "model-float.tflite", run
    if not path.is_file():
        raise CheckpointError(f"no such run directory or ONNX file: {path}")
    stem = path.with_suffix("")
    return path, Path(f"{stem}-{target}.tflite"), Path(f"{stem}-float.tflite"), None


def _samples(run: RunDir | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    if run is None or not run.samples.is_file():
        return None, None
    try:
        with np.load(run.samples) as data:
            return data["inputs"].astype(np.float32), data["labels"]
    except (OSError, KeyError, ValueError) as error:
        raise CheckpointError(f"{run.samples} is not a readable samples file ({error})") from None


def _versus_torch(
    run: RunDir, onnx_path: Path, result: ConversionResult, inputs: np.ndarray
) -> tuple[Agreement, list[int]]:
    """The flatbuffer against PyTorch, on every sample where PyTorch has no sign tie.

    A sample on which LCE took a tie (`result.sign_ties`) was shown by the gate to be ONNX
    Runtime's model up to that tie, so there PyTorch is compared with ONNX Runtime's outputs:
    every sample still ties the flatbuffer to the checkpoint (a stale model.onnx shows up), even
    when, as for QuickNet at 224x224, LCE takes a tie on nearly every one. PyTorch's own ties
    against ONNX Runtime are found the same way and left out. Returns (agreement, all samples
    with a tie on either side).
    """
    from bnnexport.export import torch_outputs
    from bnnexport.runs import load_model
    from converters.ties import explain_by_ties
    from converters.validate import compare

    reference = torch_outputs(load_model(run.root), inputs)
    candidate = np.array(result.lce_outputs, copy=True)
    lce_tied = sorted(result.sign_ties)
    candidate[lce_tied] = result.onnx_outputs[lce_tied]
    versus = compare(reference, candidate, RTOL)
    if versus.argmax_agreement == 1.0 and versus.max_abs_diff <= versus.tolerance:
        return versus, lce_tied
    _, torch_ties = explain_by_ties(onnx_path, inputs, result.onnx_outputs, reference, RTOL)
    keep = [row for row in range(len(inputs)) if row not in torch_ties.rows]
    return compare(reference[keep], candidate[keep], RTOL), sorted({*lce_tied, *torch_ties.rows})


def convert_run(
    path: str | Path, target: str = "arm64", fmt: str = "lce", samples: int | None = None,
    batch_twin: int | None = None,
) -> ConvertReport:
    """Convert a run's model.onnx (or any MODEL.onnx) to an LCE flatbuffer for `target`.

    Args:
        path: a run directory (after `bnnexport export`) or an ONNX file.
        target: "arm64" or "arm32" (the same LCE target "arm"; only the file name differs).
        fmt: "lce", or "tflite" to also write a float TFLite model (model-float.tflite).
        samples: check on only the first N samples of samples.npz (None = all).
        batch_twin: also write MODEL-TARGET-bN.tflite, converted at batch N (`converters.batch`).

    Raises:
        ConversionMismatchError / FidelityError (exit 1) when the flatbuffer disagrees with
        ONNX Runtime or PyTorch; UnsupportedOpError, InvalidModelError, CheckpointError (exit 2).
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    start = time.perf_counter()
    onnx_path, output, float_output, run = _locate(Path(path), target)
    inputs, _labels = _samples(run)
    if inputs is not None and samples is not None:
        inputs = inputs[:samples]

    from converters.lce import convert_onnx

    result = convert_onnx(
        onnx_path, output, target=target, inputs=inputs,
        write_float_tflite=float_output if fmt == "tflite" else None, rtol=RTOL,
    )  # fmt: skip
    torch_agreement = torch_diff = torch_samples = None
    ties = list(result.sign_ties)
    if run is not None and inputs is not None and run.checkpoint.is_file():
        versus, ties = _versus_torch(run, onnx_path, result, inputs)
        torch_agreement, torch_diff = versus.argmax_agreement, versus.max_abs_diff
        torch_samples = versus.samples
        if versus.argmax_agreement < 1.0 or not versus.max_abs_diff <= versus.tolerance:
            for written in (output, result.float_output):
                if written is not None:
                    Path(written).unlink(missing_ok=True)
            raise FidelityError(
                f"the LCE flatbuffer disagrees with PyTorch on {versus.samples} samples without "
                f"a sign tie: argmax agreement {versus.argmax_agreement:.2%}, max |diff| "
                f"{versus.max_abs_diff:.3g} (tolerance {versus.tolerance:.3g}); no flatbuffer kept"
            )
    report = ConvertReport(
        output=str(result.output),
        target=target,
        format=fmt,
        binary_layers=result.binary_layers,
        lce_bconv2d=result.lce_bconv2d,
        float_conv2d=result.float_conv2d,
        fully_connected=result.fully_connected,
        argmax_agreement=result.argmax_agreement,
        max_abs_diff=result.max_abs_diff,
        torch_argmax_agreement=torch_agreement,
        torch_max_abs_diff=torch_diff,
        torch_samples=torch_samples,
        samples=result.samples,
        random_inputs=result.random_inputs,
        onnx_bytes=result.onnx_bytes,
        lce_bytes=result.lce_bytes,
        tflite_float_bytes=result.tflite_float_bytes,
        float_output=str(result.float_output) if result.float_output else None,
        seconds=time.perf_counter() - start,
        op_histogram=result.op_histogram,
        sign_ties=ties,
        sign_tie_largest=result.sign_tie_largest,
    )
    if batch_twin is not None:  # model-TARGET-bN.tflite for accuracy on a device, same gate
        from converters.batch import convert_twin

        report.batch_twin = convert_twin(onnx_path, output, batch_twin, target, inputs,
                                         result.lce_outputs, RTOL).to_json()
    if run is not None:
        report.save(run.root / "convert.json")
    return report
