"""The bench stage: accuracy, agreement with PyTorch and latency of every backend of one run.

On the host, on the same test samples (`RUN_DIR/samples.npz`) and in one call: PyTorch, ONNX
Runtime, the float TFLite model and the LCE flatbuffer (LCE's interpreter with indirect BGEMM,
docs/LCE_NOTES.md "Running flatbuffers"), and beside it the int8 one when the run has it
(`lce-int8`, `convert --float-layers int8`), timed by `bnnexport.stages.bench.host`. With a
`DeviceTarget` the LCE flatbuffer also runs on that device over SSH, through a device runner picked
by name from `deploy.runners`; `bnnexport.stages.bench.device` makes its rows. Latency is batch 1
after warm-up; all times are milliseconds.

Example:
    >>> from bnnexport.stages.bench.options import BenchOptions
    >>> report = bench("runs/demo", BenchOptions(runs=100, threads=1))   # doctest: +SKIP
    >>> [(b.name, b.top1, b.latency_ms["median"]) for b in report.backends]  # doctest: +SKIP
    [('pytorch', 0.91, 0.41), ('onnxruntime', 0.91, 0.05), ...]
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from bnnexport.errors import DataError
from bnnexport.run import files, provenance
from bnnexport.run.checkpoint import open_run_model
from bnnexport.run.directory import EXPORT_HINT, RunDir
from bnnexport.run.files import write_bytes_atomic
from bnnexport.run.samples import load_samples
from bnnexport.stages.bench.device import (
    Connected,
    Scoring,
    connect,
    device_profile,
    device_rows,
    ensure_batched_copy,
    scaling_rows,
)
from bnnexport.stages.bench.host import (
    CONVERT_HINT,
    INT8,
    host_backends,
    host_identity,
    measure_host,
    require,
    usable_backends,
)
from bnnexport.stages.bench.options import BenchOptions, DeviceTarget
from bnnexport.stages.bench.profile import profile_change
from bnnexport.stages.bench.scoring import BackendResult
from bnnexport.stages.report import Report, write_json_atomic


@dataclasses.dataclass
class BenchReport(Report):
    """What `bench` measured; saved as RUN_DIR/bench.json, summarised in RUN_DIR/report.md."""

    run_dir: str
    samples: int
    runs: int
    threads: int
    num_classes: int
    host: dict[str, Any]
    backends: list[BackendResult]
    files: dict[str, int] = dataclasses.field(default_factory=dict)
    device: dict[str, Any] | None = None
    report_md: str | None = None
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # backend: why
    random_inputs: bool = False  # a model file benched without --samples-file
    # with `DeviceTarget.profile`: the device's time by PyTorch layer
    # (bnnexport.stages.bench.profile)
    profile: dict[str, Any] | None = None
    # the binary weights of the run's record (None: a model file benched on its own)
    binary_parameters: int | None = None
    # with `DeviceTarget.profile` and an int8 flatbuffer: its profile, and per layer the change
    # from the float flatbuffer's (`change`, bnnexport.stages.bench.profile.profile_change)
    int8_profile: dict[str, Any] | None = None

    def to_table(self) -> str:
        """One line per backend: accuracy, agreement, latency, size."""
        head = [
            "backend",
            "where",
            "top1",
            "top5",
            "agree",
            "max|diff|",
            "median ms",
            "p90 ms",
            "mean ms",
            "std ms",
            "min ms",
            "size KB",
            "peak MB",
        ]
        rows = [head]
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        for b in self.backends:
            lat = b.latency_ms
            rows.append(
                [
                    b.name,
                    b.where,
                    fmt(b.top1, ".4f"),
                    fmt(b.top5, ".4f"),
                    fmt(b.argmax_agreement, ".4f"),
                    fmt(b.max_abs_diff, ".2g"),
                    fmt(lat.get("median"), ".3f"),
                    fmt(lat.get("p90"), ".3f"),
                    fmt(lat.get("mean"), ".3f"),
                    fmt(lat.get("std"), ".3f"),
                    fmt(lat.get("min"), ".3f"),
                    fmt(None if b.size_bytes is None else b.size_bytes / 1024, ".1f"),
                    fmt(b.extra.get("peak_memory_mb"), ".3g"),
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        footer = [
            f"{self.samples} samples, {self.runs} timed runs at batch 1, {self.threads} thread(s)"
        ]
        footer += device_footer(self.device, self.backends)
        if self.profile is not None:
            footer.append(self.profile["summary"])
        if self.int8_profile is not None:
            footer.append(self.int8_profile["change"]["summary"])
        for name, why in self.skipped.items():
            footer.append(f"skipped {name}: {why}")
        if self.report_md:
            footer.append(f"report: {self.report_md}")
        return "\n".join(lines + [""] + footer)


def device_footer(device: dict[str, Any] | None, backends: list[BackendResult]) -> list[str]:
    """The table's lines on the device: who it is, which tool ran there, whether its latency
    is emulated, and how far an int8 flatbuffer's outputs are from the host's in steps."""
    if not device:
        return []
    lines = [f"device: {device.get('destination')}: {device.get('uname')}"]
    tools = {b.extra["tool"]["label"] for b in backends if (b.extra.get("tool") or {}).get("label")}
    lines += [f"device tool: {tool}" for tool in sorted(tools)]
    if device.get("emulated"):
        lines.append(f"device latencies are emulated, not ARM timings: {device['emulated']}")
    for b in backends:
        if b.extra.get("max_steps"):
            lines.append(
                f"{b.name}: up to {b.extra['max_steps']} int8 output step(s) apart on "
                f"{b.extra['samples_differing']} of {b.samples} samples (how LCE's ARM build "
                'computes int8: docs/LCE_NOTES.md "int8 on ARM")'
            )
    return lines


def _bench_inputs(run: RunDir, samples: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The run's samples, once bench's outputs are known to be replaceable (a file of the
    user's fails now, not after timing) and the samples to be the model's."""
    for name in ("bench.json", "report.md"):
        files.require_replaceable(run.root / name)
    inputs, labels = load_samples(run, samples)
    _require_input_shape(run, inputs)
    return inputs, labels


def _require_input_shape(run: RunDir, inputs: np.ndarray) -> None:
    """Samples of another model (e.g. a stale samples.npz after `train --force`) are refused."""
    from bnnexport.run.checkpoint import load_checkpoint

    expected = load_checkpoint(run.root)["model_kwargs"].get("input_shape")
    if expected is not None and list(inputs.shape[1:]) != [int(v) for v in expected]:
        raise DataError(
            f"{run.samples} holds inputs of shape {list(inputs.shape[1:])} but the model takes "
            f"{list(expected)}: {EXPORT_HINT.format(run=run.root)}"
        )


def _connect(device: DeviceTarget, run: RunDir, target: str, int8_only: bool) -> Connected:
    """The flatbuffer checked current and the device reached, before any host benchmark: the
    float one, or the int8 one of a run that has no other (trained with int8 float layers)."""
    from bnnexport.run.provenance import require_current

    hint = CONVERT_HINT.format(run=run.root, target=target)
    flatbuffer = require(run.flatbuffer(target, int8=int8_only), hint)
    require_current(run.root, flatbuffer.name, f": run `bnnexport convert {run.root}` again")
    return connect(device, flatbuffer)


def bench(
    run_dir: str | Path,
    options: BenchOptions = BenchOptions(),
    device: DeviceTarget | None = None,
    write_report: bool = True,
    progress: bool = False,
) -> BenchReport:
    """Measure every backend of `run_dir` on the host (and the LCE model on `device`).

    Args:
        run_dir: a run directory with checkpoint.pt, samples.npz, model.onnx, model-float.tflite
            and model-<target>.tflite.
        options: runs, warm-up, threads, samples and target (`BenchOptions`).
        device: where and how to run the LCE flatbuffer on a device too (`DeviceTarget`). With
            a runner that needs it (`lce_benchmark_model`), accuracy on the device runs the
            batched copy (batch N) RUN_DIR/model-TARGET-bN.tflite, N = min(device.batch,
            samples), in N-sample chunks.
        progress: a progress bar over the backends on stderr.
    Backends whose model file is missing or stale are skipped; the report says why (`skipped`).
    Writes RUN_DIR/bench.json and (with `write_report`) RUN_DIR/report.md with plots.
    """
    run = RunDir(run_dir).require()
    inputs, labels = _bench_inputs(run, options.samples)
    target, threads = options.target, options.threads
    backends, skipped = usable_backends(run, host_backends(run, target, threads), target)
    on, connected = OnDevice.of(run, target, backends), None
    if device is not None:
        connected = _connect(device, run, target, on.int8_only)
        _prepare_copies(run, connected, device, on, len(inputs), progress)
    # PyTorch comes first: the reference for every other backend
    results, host_outputs = measure_host(backends, inputs, labels, options, progress, run.samples)
    reference = host_outputs[results[0].name]
    identity = raw = profile = int8_profile = None
    if device is not None and connected is not None:
        scoring = Scoring(inputs, labels, reference, host_outputs.get("lce"))
        rows, raw = _device_results(connected, device, options, scoring, on, host_outputs)
        results.extend(rows)
        identity = connected.identity
        if device.profile:
            profile, int8_profile = _profiles(results, connected, run.onnx, on)
    report = BenchReport(
        run_dir=str(run.root),
        samples=len(inputs),
        runs=options.runs,
        threads=threads,
        num_classes=int(reference.shape[1]),
        host=host_identity(),
        backends=results,
        device=identity,
        files=_file_sizes(run, target),
        skipped=skipped,
        profile=profile,
        int8_profile=int8_profile,
        binary_parameters=open_run_model(run.root).kernels.parameters,
    )
    save_results(report, run.root / "bench.json", write_report, companions=_device_log(run, raw))
    return report


def _device_log(run: RunDir, raw: str | None) -> list[Path]:
    """RUN_DIR/bench_device.log with the device runner's raw log, when it wrote one."""
    if raw is None:
        return []
    return [write_bytes_atomic(run.root / "bench_device.log", raw.encode())]


@dataclasses.dataclass(frozen=True)
class OnDevice:
    """Which flatbuffers go to the device: the target's, and its int8 one (None: none) beside
    the float one, or alone (`int8_only`: a run trained with int8 float layers has no other)."""

    target: str
    int8: Path | None
    int8_only: bool

    @classmethod
    def of(cls, run: RunDir, target: str, backends: list[tuple[str, Any, Any]]) -> OnDevice:
        """What goes to the device of `run`, given the host `backends` found usable: the int8
        flatbuffer when one of them is it, alone when the run has no float one."""
        int8 = run.flatbuffer(target, int8=True) if any(b[0] == INT8 for b in backends) else None
        return cls(target, int8, int8 is not None and not run.flatbuffer(target).is_file())


def _prepare_copies(
    run: RunDir,
    connected: Connected,
    device: DeviceTarget,
    on: OnDevice,
    samples: int,
    progress: bool,
) -> None:
    """The batched copies a runner that scores through one needs, made before any timing."""
    if not connected.runner.batched_copy:
        return
    if not on.int8_only:
        ensure_batched_copy(run.root, on.target, samples, device.batch, progress)
    if on.int8 is not None:
        ensure_batched_copy(run.root, on.target, samples, device.batch, progress, int8=True)


def _device_results(
    connected: Connected,
    device: DeviceTarget,
    options: BenchOptions,
    scoring: Scoring,
    on: OnDevice,
    host_outputs: dict[str, np.ndarray],
) -> tuple[list[BackendResult], str | None]:
    """The device's rows (float, then int8 beside it, then the thread scaling) and the
    runner's raw log."""
    rows, raw = [], None
    if not on.int8_only:
        rows, raw = device_rows(connected, device, options, scoring)
    if on.int8 is not None:
        on_int8 = dataclasses.replace(connected, flatbuffer=on.int8)
        int8_scoring = dataclasses.replace(scoring, host_lce=host_outputs.get(INT8))
        int8_rows, more = device_rows(on_int8, device, options, int8_scoring, INT8)
        rows.extend(int8_rows)
        raw = "\n".join(log for log in (raw, more) if log) or None
    rows.extend(scaling_rows(connected, device, options, scoring))
    return rows, raw


def _profiles(
    results: list[BackendResult], connected: Connected, onnx_path: Path, on: OnDevice
) -> tuple[dict | None, dict | None]:
    """The device's op profile by PyTorch layer, and the int8 flatbuffer's beside it with what
    changed."""
    profile = device_profile(
        results, connected.flatbuffer, onnx_path, INT8 if on.int8_only else "lce"
    )
    if on.int8 is None or on.int8_only:
        return profile, None
    int8_profile = device_profile(results, on.int8, onnx_path, INT8)
    int8_profile["change"] = profile_change(profile, int8_profile)
    return profile, int8_profile


def save_results(
    report: BenchReport,
    results: Path,
    write_report: bool,
    prefix: str = "",
    companions: list[Path] | None = None,
) -> None:
    """Write `results` (the report as JSON) and, with `write_report`, report.md and its plots
    (names starting with `prefix`). They and the `companions` (the device's log) are recorded
    as made from `results`, so a stage that removes the results as stale (`train --resume`:
    `provenance.remove_derived`) takes every one of them along, whatever its name."""
    made = list(companions or [])
    if write_report:
        from bnnexport.stages.bench.report_md import write_report as render

        written = render(report, results.parent, prefix)
        report.report_md = str(written[0])
        made += written
    write_json_atomic(results, report.to_json())
    for path in made:
        provenance.record(results.parent, path.name, [results.name])


def _file_sizes(run: RunDir, target: str) -> dict[str, int]:
    """Bytes of each model file present (checkpoint.pt also holds optimizer state)."""
    names = [
        "checkpoint.pt",
        "model.safetensors",
        "model.onnx",
        "model-float.tflite",
        run.flatbuffer(target).name,
        run.flatbuffer(target, int8=True).name,
    ]
    return {n: (run.root / n).stat().st_size for n in names if (run.root / n).is_file()}
