"""What a refusal by the conversion gate leaves behind: one line, and a diagnostics file.

`converters` raises `ConversionMismatchError` with the gate's `diagnostics` (which samples,
which binarization first differs, how many positions, how near zero, what the twin said) and
never writes them itself (it does not import bnnexport); `gate_refusal` writes them through
`bnnexport.run.files`, so the file is bnnexport's, and returns the one-line `FidelityError` naming
it. `explain_refusal` turns a refusal of a degenerate model into the `InconclusiveCheckError`
that says so (docs/ARCHITECTURE.md, "Conversion gate").

Example:
    >>> from pathlib import Path
    >>> from bnnexport.run.refusals import refusal_path
    >>> refusal_path(Path("net-arm64.tflite"), None).name
    'net-arm64-gate-refusal.json'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bnnexport.converters.gate import RTOL
from bnnexport.errors import FidelityError
from bnnexport.run import files
from bnnexport.run.directory import RunDir

if TYPE_CHECKING:
    from bnnexport.converters.errors import ConversionMismatchError

REFUSAL_FILE = "gate-refusal.json"


def refusal_path(output: Path, run: RunDir | None) -> Path:
    """Where a refusal's diagnostics go: RUN_DIR/gate-refusal.json, or beside the output."""
    if run is not None:
        return run.root / REFUSAL_FILE
    return output.with_name(f"{output.stem}-{REFUSAL_FILE}")


def gate_refusal(error: ConversionMismatchError, path: Path, outcome: str) -> FidelityError:
    """The one-line FidelityError for a refusal by the gate; its diagnostics (which samples,
    which binarization first differs, how many positions, how near zero, what the twin said)
    written to `path` (recorded as bnnexport's), which the line names."""
    payload = {"error": str(error), **error.diagnostics}
    text = json.dumps(payload, indent=2, default=str) + "\n"
    files.write_bytes_atomic(path, text.encode())
    return FidelityError(f"{error}; {outcome}; diagnostics in {path}")


def explain_refusal(
    error: ConversionMismatchError, onnx_path: Path, inputs: np.ndarray, escape: str | None = None
) -> ConversionMismatchError:
    """`error`, or the InconclusiveCheckError that explains it (a degenerate model); `escape`
    replaces the advice's --trust-twin (export has no such option)."""
    from bnnexport.converters.gate import TRUST_TWIN, GateOptions, OnnxProbe, inconclusive
    from bnnexport.converters.graph import load_onnx
    from bnnexport.converters.normalize import normalized_or_as_is

    rows = error.diagnostics.get("failing_samples") or list(range(len(inputs)))
    # as the normaliser writes it: where the probe finds a model of your own's binarizations
    probe = OnnxProbe(normalized_or_as_is(load_onnx(onnx_path)))
    options = GateOptions(rtol=RTOL)
    found = inconclusive(
        error, probe, inputs, rows, options, escape=TRUST_TWIN if escape is None else escape
    )
    return found or error
