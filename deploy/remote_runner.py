"""Run the device-side runner (`deploy/runner.py`) on a device over SSH.

For devices with Python and larq_compute_engine (x86 edge boxes): it measures latency AND accuracy
on the test samples sent with the model, and brings the model's outputs back so the host can
compare them with PyTorch.

Example:
    >>> from deploy.ssh import SshClient
    >>> client = SshClient("me@edgebox")                                 # doctest: +SKIP
    >>> result, outputs = run_remote_runner(client, "model-arm64.tflite",
    ...                                     samples="samples.npz", runs=100)  # doctest: +SKIP
    >>> result["latency_ms"]["median"], outputs.shape                   # doctest: +SKIP
    (1.31, (1000, 10))
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from deploy.errors import DeviceError, MissingBinaryError
from deploy.ssh import SshClient

RUNNER = Path(__file__).with_name("runner.py")


def has_lce_python(client: SshClient, python: str = "python3") -> bool:
    """True when `python` on the device can import LCE's interpreter."""
    probe = f"{shlex.quote(python)} -c 'import larq_compute_engine.tflite.python.interpreter'"
    return client.run(probe, timeout=120, check=False).returncode == 0


def run_remote_runner(
    client: SshClient,
    flatbuffer: str | Path,
    samples: str | Path | None = None,
    runs: int = 100,
    threads: int = 1,
    warmup: int = 10,
    python: str = "python3",
    timeout: float = 600.0,
) -> tuple[dict[str, Any], np.ndarray | None]:
    """Copy runner, model and samples to a fresh directory on the device, run, fetch, clean up.

    Returns the runner's JSON object and the model's outputs on the samples (None without
    samples). Raises `MissingBinaryError` when the device's `python` cannot import LCE.
    """
    if not has_lce_python(client, python):
        raise MissingBinaryError(
            f"{python} with larq_compute_engine is not available on {client.destination}; "
            "use --runner lce_benchmark_model (LCE has no pip wheel for Linux aarch64)"
        )
    with client.workdir() as work:
        client.put(RUNNER, f"{work}/runner.py")
        model = f"{work}/{Path(flatbuffer).name}"
        client.put(flatbuffer, model)
        argv = [
            python,
            f"{work}/runner.py",
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
