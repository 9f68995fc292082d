"""Device rows of `bench` for the `lce_benchmark_model` runner: latency and accuracy on the device.

The latency comes from the batch-1 flatbuffer (`model-arm64.tflite`); accuracy from its batch-N
copy (`model-arm64-bN.tflite`, written by `bnnexport convert RUN_DIR --batched-copy N`), run over
all samples in N-sample chunks by the device's own `lce_benchmark_model`
(`deploy.device_accuracy`). N is `min(batch, samples)`, 64 by default. The device's outputs are
scored twice: against PyTorch (row `lce`) and against the host's LCE interpreter on the same
flatbuffer family (row `lce vs host lce`). Without the copy, or with a binary that has no
`--output_filepath`, the device row has latency only and a one-line note says why.

Example:
    >>> from bnnexport.device_accuracy import batched_path
    >>> batched_path("runs/demo", "arm64", 64).name
    'model-arm64-b64.tflite'
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bnnexport.errors import CheckpointError
from bnnexport.scoring import score
from converters.batch import batched_path as flatbuffer_batched_path

DEFAULT_BATCH = 64
VERSUS_HOST = "lce vs host lce"


def batched_path(run_dir: str | Path, target: str, batch: int) -> Path:
    """Where the batch-`batch` copy of RUN_DIR/model-TARGET.tflite lives (the name `convert
    --batched-copy` gives it, `converters.batch.batched_path`)."""
    return flatbuffer_batched_path(Path(run_dir) / f"model-{target}.tflite", batch)


def copy_batch(samples: int, batch: int = DEFAULT_BATCH) -> int:
    """The chunk size used on the device: `batch`, capped by the number of samples."""
    return max(1, min(batch, samples))


def _check_copy(copy: Path, inputs: np.ndarray, batch: int) -> None:
    """Raise CheckpointError unless the copy takes exactly `batch` samples of the inputs' shape."""
    from converters.runtimes import lce_interpreter

    shape = [int(d) for d in lce_interpreter(copy, 1).input_shapes[0]]
    expected = [batch, *inputs.shape[1:]]
    if shape != expected:
        raise CheckpointError(
            f"{copy} takes input {shape}, bench needs {expected}: convert it again with "
            f"`bnnexport convert {copy.parent} --batched-copy {batch}`"
        )


def _device_measurements(
    device: Any, copy_name: str, batch: int, note: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The latency statistics and the extra fields of the device's `lce` row."""
    parsed = device.result
    measured = device.outputs is not None
    # benchmark_model prints no percentiles: median and p90 stay unknown rather than invented
    latency = {
        "min": parsed.min_ms,
        "median": None,
        "p90": None,
        "mean": parsed.mean_ms,
        "std": parsed.std_ms,
    }
    extra = {
        "runner": "lce_benchmark_model",
        "max_ms": parsed.max_ms,
        "init_ms": parsed.init_ms,
        "peak_memory_mb": parsed.peak_memory_mb,
        "op_types": [dataclasses.asdict(t) for t in parsed.op_types],
        "ops": [dataclasses.asdict(o) for o in parsed.ops],
        "accuracy_model": copy_name if measured else None,
        "accuracy_batch": batch if measured else None,
        "accuracy_invocations": device.invocations,
        "accuracy_seconds": device.accuracy_seconds,
        "note": note,
    }
    return latency, extra


def device_lce_rows(
    client: Any,
    run_dir: Path,
    target: str,
    inputs: np.ndarray,
    labels: np.ndarray,
    reference: np.ndarray,
    host_lce: np.ndarray | None,
    options: Any,
    batch: int = DEFAULT_BATCH,
) -> tuple[list[Any], str]:
    """Run the LCE flatbuffer on the device with `lce_benchmark_model`; return rows and raw log.

    `options` is a `deploy.device_accuracy.DeviceOptions`; `reference` are PyTorch's outputs and
    `host_lce` the host LCE interpreter's on the same samples.
    """
    from deploy.device_accuracy import AccuracyJob, run_on_device

    flatbuffer = run_dir / f"model-{target}.tflite"
    batch = copy_batch(len(inputs), batch)
    copy = batched_path(run_dir, target, batch)
    job = note = None
    if copy.is_file():
        _check_copy(copy, inputs, batch)
        job = AccuracyJob(
            copy,
            np.ascontiguousarray(inputs, np.float32),
            batch,
            outputs_per_sample=int(reference.shape[1]),
        )
    else:
        note = (
            f"no batch-{batch} copy {copy.name}: accuracy not measured on the device, latency "
            f"only (`bnnexport convert {run_dir} --batched-copy {batch}` writes it)"
        )
    device = run_on_device(client, flatbuffer, options, job)
    note = device.note or note
    latency, extra = _device_measurements(device, copy.name, batch, note)
    extra["threads"] = options.threads
    where = client.destination
    rows = [score("lce", where, flatbuffer, device.outputs, labels, reference, latency, extra)]
    if device.outputs is not None and host_lce is not None:
        rows.append(
            score(
                VERSUS_HOST,
                where,
                copy,
                device.outputs,
                labels,
                host_lce,
                {},
                {"reference": "host lce"},
            )
        )
    if note:
        print(f"bnnexport: note: {note}", file=sys.stderr)
    return rows, device.raw


def thread_scaling_rows(
    client: Any, flatbuffer: Path, options: Any, threads: tuple[int, ...]
) -> list[Any]:
    """One latency-only row per further thread count (`lce (N threads)`): the batch-1 flatbuffer
    benchmarked again on the device with `--num_threads=N`, op profile and peak memory included.
    `options` is a `deploy.device_accuracy.DeviceOptions` (its own thread count is replaced)."""
    from deploy.device_accuracy import run_on_device

    rows = []
    for count in threads:
        device = run_on_device(client, flatbuffer, dataclasses.replace(options, threads=count))
        latency, extra = _device_measurements(device, "", 0, None)
        extra["threads"] = count
        where = client.destination
        rows.append(score(f"lce ({count} threads)", where, flatbuffer, None, np.zeros(0), None,
                          latency, extra))  # fmt: skip
    return rows
