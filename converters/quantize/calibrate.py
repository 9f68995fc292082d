"""Post-training calibration: the range of every int8 activation, from samples run in ONNX
Runtime.

Each quantization point gets the smallest and largest value it takes on the calibration
samples (min-max calibration, as ONNX Runtime's and TFLite's post-training quantizers do by
default), widened to hold 0 (`QuantPoint.of_range`).

Example:
    >>> ranges = activation_ranges(model, ["input", "/fc/Gemm_output_0"], samples)  # doctest: +SKIP
    >>> ranges["input"]                                                            # doctest: +SKIP
    (-1.0, 1.0)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from bnnexport.converters.errors import InputShapeError
from bnnexport.converters.runtimes import probe_session


def activation_ranges(
    model: onnx.ModelProto, tensors: Sequence[str], inputs: np.ndarray
) -> dict[str, tuple[float, float]]:
    """(min, max) of each of `tensors` over `inputs` (NCHW samples of the model's input), run
    at the model's batch (a fixed batch takes the samples in chunks, the last one padded with
    its first sample)."""
    session, batch = probe_session(model, tensors)
    first = session.get_inputs()[0]
    inputs = np.asarray(inputs, np.float32)
    expected = [d if isinstance(d, int) else None for d in first.shape[1:]]
    if inputs.ndim != len(first.shape) or any(
        e is not None and e != d for e, d in zip(expected, inputs.shape[1:], strict=True)
    ):
        raise InputShapeError(
            f"calibration samples of shape {list(inputs.shape)} do not fit the model's input "
            f"{list(first.shape)} (any number of samples, the same other dimensions)"
        )
    if len(inputs) == 0:
        raise InputShapeError("no calibration samples")
    lows = dict.fromkeys(tensors, np.inf)
    highs = dict.fromkeys(tensors, -np.inf)
    names = list(tensors)
    for start in range(0, len(inputs), batch):
        chunk = inputs[start : start + batch]
        if len(chunk) < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch - len(chunk), axis=0)])
        for name, value in zip(names, session.run(names, {first.name: chunk}), strict=True):
            lows[name] = min(lows[name], float(np.min(value)))
            highs[name] = max(highs[name], float(np.max(value)))
    return {name: (lows[name], highs[name]) for name in names}
