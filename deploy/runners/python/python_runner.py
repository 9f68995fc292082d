"""The `python` runner's `DeviceRunner`: the device script run over SSH under the device's Python.

It needs `python3` with numpy and larq_compute_engine on the device (x86_64 or macOS boxes: LCE
has no aarch64 wheel). One run of it times batch 1 (min / median / p90 / mean / std) and
computes the outputs on the samples sent with the model (`run_remote_runner`: the script, the
model and the samples copied to a fresh directory on the device, the outputs fetched back), so
every row it gives, at any thread count, is scored. It has no op profiler.

Example:
    >>> from bnnexport.deploy.runners import get_runner
    >>> runner = get_runner("python")
    >>> runner.profiles, runner.batched_copy
    (False, False)
    >>> runner.measure(client, flatbuffer, RunSettings(threads=2), samples)  # doctest: +SKIP
    Measurement(latency={'min': 1.2, 'median': 1.3, ...}, ...)
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from bnnexport.deploy.connection import Connection
from bnnexport.deploy.errors import DeviceError, MissingBinaryError
from bnnexport.deploy.runners.registry import (
    LATENCY_KEYS,
    Measurement,
    RunSettings,
    Samples,
    register_runner,
)

# the script the device runs: stdlib, numpy and LCE only, copied over (by path) for each run
DEVICE_SCRIPT = Path(__file__).with_name("device_script.py")


def has_lce_python(client: Connection, python: str = "python3") -> bool:
    """True when `python` on the device can import LCE's interpreter."""
    probe = f"{shlex.quote(python)} -c 'import larq_compute_engine.tflite.python.interpreter'"
    return client.run(probe, timeout=120, check=False).returncode == 0


def run_remote_runner(
    client: Connection,
    flatbuffer: str | Path,
    samples: str | Path | None = None,
    runs: int = 100,
    threads: int = 1,
    warmup: int = 10,
    python: str = "python3",
    timeout: float = 600.0,
) -> tuple[dict[str, Any], np.ndarray | None]:
    """Copy the device script, model and samples to a fresh directory on the device, run the
    script, fetch its outputs, clean up.

    Returns the runner's JSON object and the model's outputs on the samples (None without
    samples). Raises `MissingBinaryError` when the device's `python` cannot import LCE.
    """
    if not has_lce_python(client, python):
        raise MissingBinaryError(
            f"{python} with larq_compute_engine is not available on {client.destination}; "
            "use --runner lce_benchmark_model (LCE has no pip wheel for Linux aarch64)"
        )
    with client.workdir() as work:
        script = f"{work}/{DEVICE_SCRIPT.name}"
        client.put(DEVICE_SCRIPT, script)
        model = f"{work}/{Path(flatbuffer).name}"
        client.put(flatbuffer, model)
        argv = [
            python,
            script,
            "--model",
            model,
            "--runs",
            str(runs),
            "--threads",
            str(threads),
            "--warmup",
            str(warmup),
            "--json",
        ]
        if samples is not None:
            client.put(samples, f"{work}/samples.npz")
            argv += ["--samples", f"{work}/samples.npz", "--outputs", f"{work}/outputs.npz"]
        done = client.run(argv, timeout=timeout, cwd=work, limit_remote=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise DeviceError(f"the runner on {client.destination} printed no JSON result")
        result = json.loads(lines[-1])
        outputs = None
        if samples is not None:
            with tempfile.TemporaryDirectory(prefix="bnnexport-device-") as local:
                client.get(f"{work}/outputs.npz", Path(local) / "outputs.npz")
                with np.load(Path(local) / "outputs.npz") as data:
                    outputs = np.array(data["outputs"])
    return result, outputs


# auto tries it first: where the device can run it, it gives median, p90 and accuracy at once
@register_runner("python", order=10)
class PythonRunner:
    """bnnexport's runner on the device: latency and outputs from one run."""

    profiles = False
    batched_copy = False

    def available(self, client: Connection, settings: RunSettings) -> bool:
        """Whether the device's Python imports LCE's interpreter."""
        return has_lce_python(client, settings.remote_python)

    def preflight(self, machine: str, settings: RunSettings) -> None:
        """Nothing to check ahead: the run itself says when the device's Python has no LCE."""

    def measure(
        self, client: Connection, flatbuffer: Path, settings: RunSettings, samples: Samples | None
    ) -> Measurement:
        """Copy the device script, the model and the samples to the device, run, fetch the
        outputs."""
        with tempfile.TemporaryDirectory(prefix="bnnexport-bench-") as tmp:
            path = None
            if samples is not None:
                path = Path(tmp) / "samples.npz"
                # exactly the host's samples, in the flatbuffer's input layout
                np.savez(path, inputs=samples.fed(), labels=samples.labels)
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
        self, client: Connection, flatbuffer: Path, settings: RunSettings, samples: Samples | None
    ) -> Measurement:
        """The same run as `measure`: its timing run computes the outputs too."""
        return self.measure(client, flatbuffer, settings, samples)
