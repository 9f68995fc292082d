"""The `lce_benchmark_model` runner's `DeviceRunner`: the tool's options in, a `Measurement` out.

Latency (min / mean / std, and the median where the tool prints one), the op profile and peak
memory come from one benchmark run of the batch-1 flatbuffer (`benchmark_tool`); the outputs for
accuracy from the flatbuffer converted at batch N (`Samples.copy`), run in N-sample chunks
(`chunked_accuracy`). Without the copy, or with a binary that has no `--output_filepath`,
it measures latency only and its note says why.

Example:
    >>> from bnnexport.deploy.runners import get_runner
    >>> runner = get_runner("lce_benchmark_model")
    >>> runner.profiles, runner.batched_copy
    (True, True)
    >>> runner.measure(client, flatbuffer, RunSettings(threads=4), samples)  # doctest: +SKIP
    Measurement(latency={'min': 14.0, 'median': None, ...}, ...)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bnnexport.deploy.connection import Connection
from bnnexport.deploy.runners.lce_benchmark_model.benchmark_tool import check_local_binary
from bnnexport.deploy.runners.lce_benchmark_model.chunked_accuracy import (
    AccuracyJob,
    DeviceOptions,
    DeviceRun,
    run_on_device,
)
from bnnexport.deploy.runners.registry import Measurement, RunSettings, Samples, register_runner


# auto falls back to it: it needs no Python on the device, only the tool
@register_runner("lce_benchmark_model", order=20)
class LceBenchmarkModel:
    """LCE's benchmark tool on the device: latency, op profile, peak memory; outputs in chunks."""

    profiles = True
    batched_copy = True

    def available(self, client: Connection, settings: RunSettings) -> bool:
        """Always: the tool is found on the device's PATH or uploaded when it runs, and a
        missing one is that run's one-line error (which names --benchmark-binary)."""
        return True

    def preflight(self, machine: str, settings: RunSettings) -> None:
        """A local binary to upload must exist and be built for the device's architecture."""
        if settings.benchmark_binary is not None:
            check_local_binary(settings.benchmark_binary, machine)

    def measure(
        self, client: Connection, flatbuffer: Path, settings: RunSettings, samples: Samples | None
    ) -> Measurement:
        """Benchmark `flatbuffer` and, given samples with their batched copy, compute their
        outputs with the copy on the device."""
        job = None
        if samples is not None and samples.copy is not None:
            inputs = samples.fed()  # raw bytes in the copy's own input layout
            job = AccuracyJob(samples.copy, inputs, samples.batch, samples.outputs_per_sample)
        run = run_on_device(client, flatbuffer, tool_options(settings), job)
        return measurement(run, job, settings.threads, self.name)  # type: ignore[attr-defined]

    def latency(
        self, client: Connection, flatbuffer: Path, settings: RunSettings, samples: Samples | None
    ) -> Measurement:
        """The batch-1 benchmark alone: outputs would cost a pass per chunk."""
        return self.measure(client, flatbuffer, settings, None)


def tool_options(settings: RunSettings) -> DeviceOptions:
    """How `lce_benchmark_model` runs on the device: its default kernels unless the settings
    ask for indirect BGEMM (`--use_indirect_bgemm=true`, which a grouped LceBconv2d needs)."""
    return DeviceOptions(
        threads=settings.threads,
        runs=settings.runs,
        warmup_runs=settings.warmup,
        binary=settings.benchmark_binary,
        timeout=settings.timeout,
        use_indirect_bgemm=settings.use_indirect_bgemm,
    )


def measurement(run: DeviceRun, job: AccuracyJob | None, threads: int, runner: str) -> Measurement:
    """The latency statistics and the row's fields of what the tool did on the device, run as
    the registered runner `runner`."""
    parsed = run.result
    measured = run.outputs is not None and job is not None
    # benchmark_model prints no p90 (and older builds no median): unknown rather than invented
    latency = {
        "min": parsed.min_ms,
        "median": parsed.median_ms,
        "p90": None,
        "mean": parsed.mean_ms,
        "std": parsed.std_ms,
    }
    extra = {
        "runner": runner,
        "max_ms": parsed.max_ms,
        "init_ms": parsed.init_ms,
        "peak_memory_mb": parsed.peak_memory_mb,
        "op_types": [dataclasses.asdict(t) for t in parsed.op_types],
        "ops": [dataclasses.asdict(o) for o in parsed.ops],
        "accuracy_model": job.flatbuffer.name if measured else None,
        "accuracy_batch": job.batch if measured else None,
        "accuracy_invocations": run.invocations,
        "accuracy_seconds": run.accuracy_seconds,
        "note": run.note,
        "threads": threads,
        "tool": None if run.tool is None else run.tool.to_json(),
    }
    return Measurement(latency, extra, run.outputs, run.raw, run.note)
