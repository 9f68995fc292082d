"""The `python` runner: bnnexport's own runner (`deploy/runner.py`) under the device's Python.

It needs `python3` with numpy and larq_compute_engine on the device (x86_64 or macOS boxes: LCE
has no aarch64 wheel). One run of it times batch 1 (min / median / p90 / mean / std) and
computes the outputs on the samples sent with the model (`deploy.remote_runner`), so every row
it gives, at any thread count, is scored. It has no op profiler.

Example:
    >>> from deploy.runners import get_runner
    >>> runner = get_runner("python")
    >>> runner.profiles, runner.batched_copy
    (False, False)
    >>> runner.measure(client, flatbuffer, RunSettings(threads=2), samples)  # doctest: +SKIP
    Measurement(latency={'min': 1.2, 'median': 1.3, ...}, ...)
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from deploy.remote_runner import has_lce_python, run_remote_runner
from deploy.runners.registry import LATENCY_KEYS, Measurement, RunSettings, Samples, register_runner


# auto tries it first: where the device can run it, it gives median, p90 and accuracy at once
@register_runner("python", order=10)
class PythonRunner:
    """bnnexport's runner on the device: latency and outputs from one run."""

    profiles = False
    batched_copy = False

    def available(self, client: Any, settings: RunSettings) -> bool:
        """Whether the device's Python imports LCE's interpreter."""
        return has_lce_python(client, settings.remote_python)

    def preflight(self, machine: str, settings: RunSettings) -> None:
        """Nothing to check ahead: the run itself says when the device's Python has no LCE."""

    def measure(
        self, client: Any, flatbuffer: Path, settings: RunSettings, samples: Samples | None
    ) -> Measurement:
        """Copy the runner, the model and the samples to the device, run, fetch the outputs."""
        with tempfile.TemporaryDirectory(prefix="bnnexport-bench-") as tmp:
            path = None
            if samples is not None:
                path = Path(tmp) / "samples.npz"
                # exactly the host's samples
                np.savez(path, inputs=samples.inputs, labels=samples.labels)
            result, outputs = run_remote_runner(
                client,
                flatbuffer,
                samples=path,
                runs=settings.runs,
                threads=settings.threads,
                warmup=settings.warmup,
                python=settings.remote_python,
                timeout=settings.timeout,
            )
        latency = {k: result["latency_ms"][k] for k in LATENCY_KEYS}
        extra = {
            "runner": self.name,  # type: ignore[attr-defined]
            "threads": settings.threads,
            "lce_version": result.get("lce_version"),
            "device_accuracy": result.get("accuracy"),
        }
        return Measurement(latency, extra, outputs)

    def latency(
        self, client: Any, flatbuffer: Path, settings: RunSettings, samples: Samples | None
    ) -> Measurement:
        """The same run as `measure`: its timing run computes the outputs too."""
        return self.measure(client, flatbuffer, settings, samples)
