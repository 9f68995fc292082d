"""One scored row of a benchmark: a backend's accuracy, agreement and latency on one machine.

`bench` scores host backends with it and `bnnexport.stages.bench.device` the device's outputs, so
both rows follow one rule: top-k from `deploy.runners.python.device_script` (None for unlabelled
samples), agreement from `converters.gate.agreement`.

Example:
    >>> import numpy as np
    >>> row = score("lce", "host", None, np.eye(3, 8), np.array([0, 1, 2]), np.eye(3, 8), {})
    >>> row.top1, row.top5, row.argmax_agreement
    (1.0, 1.0, 1.0)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from bnnexport.converters.gate import compare_outputs
from bnnexport.deploy.runners.python.device_script import topk_accuracy


@dataclasses.dataclass
class BackendResult:
    """One backend on one machine: accuracy, agreement with PyTorch, latency, model size."""

    name: str
    where: str
    model: str | None
    size_bytes: int | None
    samples: int
    top1: float | None
    top5: float | None
    argmax_agreement: float | None
    max_abs_diff: float | None
    latency_ms: dict[str, float | None]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def score(
    name: str,
    where: str,
    model: Path | None,
    outputs: np.ndarray | None,
    labels: np.ndarray,
    reference: np.ndarray | None,
    latency: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> BackendResult:
    """One result row: top-1/top-5 of `outputs` against `labels` (None without ground truth),
    argmax agreement and max |diff| against `reference`, the model file's size, `latency`."""
    top1 = top5 = agree = diff = None
    if outputs is not None:
        outputs = outputs.reshape(len(outputs), -1)
        top1 = topk_accuracy(outputs, labels, 1)
        top5 = topk_accuracy(outputs, labels, 5) if outputs.shape[1] > 5 else None
        if reference is not None:
            agreement = compare_outputs(reference, outputs)
            agree, diff = agreement.argmax_agreement, agreement.max_abs_diff
    return BackendResult(
        name=name,
        where=where,
        model=str(model) if model else None,
        size_bytes=model.stat().st_size if model and model.is_file() else None,
        samples=len(labels),
        top1=top1,
        top5=top5,
        argmax_agreement=agree,
        max_abs_diff=diff,
        latency_ms=latency,
        extra=extra or {},
    )
