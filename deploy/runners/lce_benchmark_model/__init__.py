"""The `lce_benchmark_model` runner: LCE's stock benchmark tool on the device, no Python there.

All of the runner lives here, on this machine's side (the device runs only the tool and
coreutils). `benchmark_runner` is the `DeviceRunner`: it turns the run settings into the tool's
options and what the tool did into a `Measurement`. `benchmark_tool` runs the tool once
(find or upload it, check its ELF architecture, build its argv) and parses what it prints.
`chunked_accuracy` runs the benchmark and, with the flatbuffer's batch-N copy, the samples in
N-sample chunks for their outputs. They may import `deploy.connection`, `deploy.errors`,
`deploy.runners.registry`, and each other downwards only: `benchmark_runner` ->
`chunked_accuracy` -> `benchmark_tool`.

Importing the package registers the runner as `lce_benchmark_model` (order 20: `auto` falls
back to it).

Example:
    >>> from bnnexport.deploy.runners.lce_benchmark_model import (
    ...     LceBenchmarkModel, run_lce_benchmark)
    >>> LceBenchmarkModel.profiles, LceBenchmarkModel.batched_copy
    (True, True)
    >>> result, _ = run_lce_benchmark(client, "model-arm64.tflite")  # doctest: +SKIP
"""

from bnnexport.deploy.runners.lce_benchmark_model.benchmark_runner import LceBenchmarkModel
from bnnexport.deploy.runners.lce_benchmark_model.benchmark_tool import (
    BenchmarkResult,
    OpTime,
    parse_benchmark_output,
    run_lce_benchmark,
)
from bnnexport.deploy.runners.lce_benchmark_model.chunked_accuracy import (
    AccuracyJob,
    DeviceOptions,
    DeviceRun,
    run_on_device,
)

__all__ = [
    "AccuracyJob",
    "BenchmarkResult",
    "DeviceOptions",
    "DeviceRun",
    "LceBenchmarkModel",
    "OpTime",
    "parse_benchmark_output",
    "run_lce_benchmark",
    "run_on_device",
]
