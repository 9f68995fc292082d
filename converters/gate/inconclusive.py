"""A refusal no comparison on real weights could have avoided: a degenerate model.

When a refused sample has more binarization inputs within rounding of zero than the tie replay
may call ties (untrained BatchNorm with its default statistics is the usual cause), every
runtime rounds them its own way and the real-weight check cannot decide the model.
`inconclusive` turns such a refusal into an `InconclusiveCheckError` that says so, how many
positions and where, and what to do (docs/ARCHITECTURE.md, "Conversion gate").
"""

from __future__ import annotations

from typing import Any

import numpy as np
from bnnexport.converters.errors import ConversionMismatchError, InconclusiveCheckError
from bnnexport.converters.gate.predicate import GateOptions, SignProbe

# the advice's last option, for the callers that have it (convert, convert_module)
TRUST_TWIN = (
    ", or convert with --trust-twin (trust_twin=True) to decide on the exact-grid twin alone"
)
CENSUS_SAMPLES = 16  # refused samples searched for binarization inputs within rounding of zero


def near_zero_census(
    probe: SignProbe, inputs: np.ndarray, options: GateOptions
) -> list[dict[str, Any]]:
    """Per sample of `inputs` and binarization, the inputs of the binarization that lie within
    rounding of zero in `probe` (|x| <= tie_rtol x its largest |x|, exact zeros included),
    where they are more than the replay could call ties (`GateOptions.tie_bound`): there the
    real-weight check cannot decide (a degenerate model, e.g. untrained BatchNorm)."""
    found = []
    for row, x in enumerate(np.asarray(inputs, np.float32)):
        _, values = probe.run(x)
        for source, value in zip(probe.sources, values, strict=True):
            top = float(np.abs(value).max())
            near = np.abs(value) <= options.tie_rtol * top
            count = int(near.sum())
            if count > options.tie_bound(value.size):
                found.append(
                    {"sample": row, "binarization": source, "near_zero": count,
                     "exact_zeros": int((value == 0).sum()), "size": int(value.size),
                     "tie_bound": options.tie_bound(value.size)}
                )  # fmt: skip
    return found


def _about_rounding(diagnostics: dict[str, Any], options: GateOptions) -> bool:
    """Whether a refusal is one that values within rounding of zero can cause: at every sign
    the refused sample's replay found different, the reference's own value lies within
    `tie_rtol` of zero (the candidate's may not: the translator moves an integer accumulator's
    exact 0 half a step, `converters.translate.values.tie_break_bias`), or the witness itself
    rounded the other way. Without a replay (no differing signs recorded, no sample refused by one)
    it cannot be told, so it may be. An int8 tensor refused (off its grid, or more than one
    step away: `converters.gate.quantized`, `bnnexport.stages.torch_probe`) is no sign's
    rounding."""
    if diagnostics.get("int8_tensor") is not None:
        return False
    if not diagnostics.get("binarizations") and diagnostics.get("refused_sample") is None:
        return True
    if str(diagnostics.get("why", "")).startswith("its witness computes other logits"):
        return True
    found = diagnostics["binarizations"]
    return bool(found) and all(d["reference_largest"] <= options.tie_rtol for d in found)


def inconclusive(
    error: ConversionMismatchError,
    probe: SignProbe,
    inputs: np.ndarray,
    rows: list[int],
    options: GateOptions,
    twin: str | None = None,
    escape: str = TRUST_TWIN,
) -> InconclusiveCheckError | None:
    """The InconclusiveCheckError explaining `error`, a refusal on samples `rows` of `inputs`
    that rounding can cause (`_about_rounding`), when on one of them more binarization inputs
    lie within rounding of zero in the reference (`probe`) than ties could explain: no
    comparison on real weights can decide such a model (`near_zero_census`). None otherwise.
    `error.diagnostics` gets `twin`, the exact-grid twin's verdict in words, when known, and
    the census when taken. `escape` ends the advice (the option that converts such a model
    anyway, where the caller has one)."""
    if twin is not None:
        error.diagnostics["twin"] = twin
    rows = list(rows)[:CENSUS_SAMPLES]
    if not _about_rounding(error.diagnostics, options):
        return None  # a sign far from zero, or logits off: wrong however the model rounds
    census = near_zero_census(probe, np.asarray(inputs)[rows], options)
    for found in census:
        found["sample"] = rows[found["sample"]]
    error.diagnostics["near_zero"] = census[:50]
    if not census:
        return None
    first = census[0]
    verdict = "" if twin is None else f"; the exact-grid twin {twin}"
    line = (
        f"{error.diagnostics.get('comparison', 'the check')} cannot be decided on real weights: "
        f"{first['near_zero']} of {first['size']} inputs of binarization "
        f"{first['binarization']!r} lie within rounding of zero on sample {first['sample']} "
        f"({first['exact_zeros']} exactly 0; ties explain at most {first['tie_bound']}), and "
        "each runtime rounds them its own way; the usual cause is BatchNorm with its default "
        "statistics (an untrained model): train it first, or randomise BatchNorm as "
        f"`bnnexport init` does{escape}{verdict}"
    )
    return InconclusiveCheckError(line, error.diagnostics)
