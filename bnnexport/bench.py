"""The bench stage: accuracy, agreement with PyTorch and latency of every backend of one run.

On the host, on the same test samples (`RUN_DIR/samples.npz`) and in one call: PyTorch, ONNX
Runtime, the float TFLite model and the LCE flatbuffer (LCE's interpreter with indirect BGEMM,
docs/LCE_NOTES.md "Running flatbuffers"). With `device="user@host"` the LCE flatbuffer also runs on
that device over SSH, through a device runner picked by name from `deploy.runners` (the stock
`lce_benchmark_model`, or bnnexport's own `python` runner); `bnnexport.device` makes its rows.
Latency is batch 1 after warm-up; all times are milliseconds.

Example:
    >>> from bnnexport.bench import BenchOptions, bench
    >>> report = bench("runs/demo", BenchOptions(runs=100, threads=1))   # doctest: +SKIP
    >>> [(b.name, b.top1, b.latency_ms["median"]) for b in report.backends]  # doctest: +SKIP
    [('pytorch', 0.91, 0.41), ('onnxruntime', 0.91, 0.05), ...]
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bnnexport import files, provenance
from bnnexport.device import (
    Connected,
    Scoring,
    device_profile,
    device_rows,
    ensure_batched_copy,
    file_device_rows,
    reach_device,
    scaling_rows,
)
from bnnexport.errors import CheckpointError, DataError
from bnnexport.reports import Report, write_bytes_atomic, write_json_atomic
from bnnexport.runs import EXPORT_HINT, RunDir, load_model, load_samples, open_model
from bnnexport.scoring import BackendResult, score

CONVERT_HINT = "run `bnnexport convert {run} --target {target} --format tflite` first"


@dataclasses.dataclass(frozen=True)
class DeviceTarget:
    """Where and how `bench` runs the LCE flatbuffer on a device over SSH.

    Example:
        >>> DeviceTarget("pi@raspberrypi.local", port=2222).runner
        'auto'
    """

    host: str  # `user@host` or an ~/.ssh/config alias
    port: int | None = None
    ssh_key: str | None = None
    ssh_options: tuple[str, ...] = ()  # `-o KEY=VALUE` options
    runner: str = "auto"  # a name of `deploy.runners`, or auto (the first the device can run)
    benchmark_binary: str | None = None  # a local lce_benchmark_model to upload
    remote_python: str = "python3"
    remote_tmp: str = "/tmp"  # where working directories go on the device
    timeout: float = 600.0  # seconds one device command may run
    batch: int = 64  # accuracy with lce_benchmark_model: the batch-N copy's N (capped by samples)
    # the device's op profile by PyTorch layer (bnnexport.profile); needs a runner that profiles
    profile: bool = False

    def __post_init__(self) -> None:
        from deploy.runners import check_runner

        check_runner(self.runner, self.profile)


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """What `bench` measures and how (the `bnnexport bench` options other than the device's).

    Example:
        >>> BenchOptions(runs=20, samples=None).threads
        1
    """

    runs: int = 100  # timed batch-1 runs per backend
    warmup: int = 10  # untimed runs before them
    threads: int = 1  # for every runtime (PyTorch, ONNX Runtime, TFLite, LCE, the device)
    samples: int | None = 1000  # the first N of samples.npz; None = all
    target: str = "arm64"  # which LCE flatbuffer: model-TARGET.tflite
    # further thread counts the device's LCE latency is measured at (one row each)
    scaling_threads: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.runs < 1 or self.threads < 1 or self.warmup < 0:
            raise ValueError("runs and threads must be at least 1, warmup at least 0")
        if any(t < 1 for t in self.scaling_threads):
            raise ValueError("scaling_threads must all be at least 1")
        if self.samples is not None and self.samples < 1:
            raise ValueError("samples must be at least 1 (or None for all)")


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
    # with `DeviceTarget.profile`: the device's time by PyTorch layer (bnnexport.profile)
    profile: dict[str, Any] | None = None
    # the binary weights of the run's record (None: a model file benched on its own)
    binary_parameters: int | None = None

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
        if self.device:
            footer.append(f"device: {self.device.get('destination')}: {self.device.get('uname')}")
        if self.profile is not None:
            footer.append(self.profile["summary"])
        for name, why in self.skipped.items():
            footer.append(f"skipped {name}: {why}")
        if self.report_md:
            footer.append(f"report: {self.report_md}")
        return "\n".join(lines + [""] + footer)


def _require(path: Path, hint: str) -> Path:
    if not path.is_file():
        raise CheckpointError(f"{path} not found: {hint}")
    return path


def _require_input_shape(run: RunDir, inputs: np.ndarray) -> None:
    """Samples of another model (e.g. a stale samples.npz after `train --force`) are refused."""
    from bnnexport.runs import load_checkpoint

    expected = load_checkpoint(run.root)["model_kwargs"].get("input_shape")
    if expected is not None and list(inputs.shape[1:]) != [int(v) for v in expected]:
        raise DataError(
            f"{run.samples} holds inputs of shape {list(inputs.shape[1:])} but the model takes "
            f"{list(expected)}: {EXPORT_HINT.format(run=run.root)}"
        )


def time_calls(call: Callable[[], Any], runs: int, warmup: int) -> dict[str, float]:
    """Call `call` `warmup` times untimed, then `runs` times timed; latency stats in ms."""
    from deploy.runner import latency_stats  # the same statistics as on the device

    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000.0)
    return latency_stats(times)


def host_backends(run: RunDir, target: str, threads: int) -> list[tuple[str, Path | None, Any]]:
    """(name, model file, factory) per host backend; a factory takes the batch-1 input and returns
    (predict_all, call_one).

    Each factory opens its runtime once (`converters.runtimes`, `threads` threads) and both
    functions use it, so the outputs bench scores come from the session or interpreter it times.
    """
    run.require()
    float_path, lce_path = run.root / "model-float.tflite", run.flatbuffer(target)
    return [
        ("pytorch", run.checkpoint, functools.partial(_pytorch, run, threads)),
        ("onnxruntime", run.onnx, functools.partial(_onnxruntime, run.onnx, threads)),
        ("tflite-float", float_path, functools.partial(_tflite_float, float_path, threads)),
        ("lce", lce_path, functools.partial(_lce, lce_path, threads)),
    ]


Factory = tuple[Callable[[np.ndarray], np.ndarray], Callable[[], Any]]


def _pytorch(run: RunDir, threads: int, x1: np.ndarray) -> Factory:
    import torch

    torch.set_num_threads(threads)  # restored by bench() once every backend has run
    model = load_model(run.root)
    one = torch.from_numpy(x1)

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return np.concatenate(
                [model(torch.from_numpy(x[i : i + 100])).numpy() for i in range(0, len(x), 100)]
            )

    def call() -> None:
        with torch.inference_mode():
            model(one)

    return predict, call


def _onnxruntime(onnx_path: Path, threads: int, x1: np.ndarray) -> Factory:
    from converters.errors import InvalidModelError
    from converters.runtimes import open_model

    model = open_model("onnxruntime", onnx_path, threads)
    inputs = model.session.get_inputs()
    if len(inputs) != 1:  # bench feeds one image tensor, as every exported BNN takes
        names = ", ".join(i.name for i in inputs)
        raise InvalidModelError(
            f"{onnx_path} has {len(inputs)} inputs ({names}); bench runs models with one input"
        )
    return model.run, (lambda: model.run_one(x1))


def _tflite_float(float_path: Path, threads: int, x1: np.ndarray) -> Factory:
    from converters.runtimes import open_model

    model = open_model("tflite", float_path, threads)
    return model.run, (lambda: model.run_one(x1))


def _lce(lce_path: Path, threads: int, x1: np.ndarray) -> Factory:
    from converters.runtimes import open_model

    model = open_model("lce", lce_path, threads)  # run_one: one call, no per-sample loop
    return model.run, (lambda: model.run_one(x1))


def usable_backends(
    run: RunDir, backends: list[tuple[str, Path | None, Any]], target: str
) -> tuple[list[tuple[str, Path | None, Any]], dict[str, str]]:
    """The backends whose model file exists and is current (bnnexport.provenance), and why
    each other one is skipped. PyTorch, the reference, always stays."""
    from bnnexport.provenance import stale_reason

    hints = {"onnxruntime": EXPORT_HINT.format(run=run.root),
             "tflite-float": CONVERT_HINT.format(run=run.root, target=target),
             "lce": CONVERT_HINT.format(run=run.root, target=target).replace(" --format tflite",
                                                                              "")}  # fmt: skip
    usable, skipped = [], {}
    for name, path, factory in backends:
        if name != "pytorch" and path is not None:
            if not path.is_file():
                skipped[name] = f"{path.name} not found: {hints[name]}"
                continue
            reason = stale_reason(run.root, path.name)
            if reason is not None:
                skipped[name] = f"{path.name} is stale ({reason}): {hints[name]} again"
                continue
            if path.suffix == ".tflite":
                _require_flatbuffer(path)
        usable.append((name, path, factory))
    return usable, skipped


def _connect(device: DeviceTarget, run: RunDir, target: str) -> Connected:
    """The flatbuffer checked current and the device reached, before any host benchmark."""
    from bnnexport.provenance import require_current

    flatbuffer = _require(run.flatbuffer(target), CONVERT_HINT.format(run=run.root, target=target))
    require_current(run.root, flatbuffer.name, f": run `bnnexport convert {run.root}` again")
    return Connected(*reach_device(device), flatbuffer)


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
    for name in ("bench.json", "report.md"):  # a file of the user's fails now, not after timing
        files.require_replaceable(run.root / name)
    target, threads = options.target, options.threads
    inputs, labels = load_samples(run, options.samples)
    _require_input_shape(run, inputs)
    connected = _connect(device, run, target) if device is not None else None
    if device is not None and connected is not None and connected.runner.batched_copy:
        ensure_batched_copy(run.root, target, len(inputs), device.batch, progress)
    backends, skipped = usable_backends(run, host_backends(run, target, threads), target)
    # PyTorch comes first: the reference for every other backend
    results, host_outputs = _measure_host(backends, inputs, labels, options, progress, run.samples)
    reference = host_outputs[results[0].name]
    identity = raw = None
    if device is not None and connected is not None:
        scoring = Scoring(inputs, labels, reference, host_outputs.get("lce"))
        rows, raw = device_rows(connected, device, options, scoring, run.root)
        results.extend(rows)
        results.extend(scaling_rows(connected, device, options, scoring))
        identity = connected.identity
    profile = None
    if device is not None and device.profile and connected is not None:
        profile = device_profile(results, connected.flatbuffer, run.onnx)
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
        binary_parameters=open_model(run.root).kernels.parameters,
    )
    logs = []
    if raw is not None:
        logs.append(write_bytes_atomic(run.root / "bench_device.log", raw.encode()))
    _save_results(report, run.root / "bench.json", write_report, companions=logs)
    return report


def _save_results(
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
        from bnnexport.report_md import write_report as render

        written = render(report, results.parent, prefix)
        report.report_md = str(written[0])
        made += written
    write_json_atomic(results, report.to_json())
    for path in made:
        provenance.record(results.parent, path.name, [results.name])


def _measure_host(
    backends: list[tuple[str, Path | None, Any]],
    inputs: np.ndarray,
    labels: np.ndarray,
    options: BenchOptions,
    progress: bool,
    samples_path: str | Path | None,
) -> tuple[list[BackendResult], dict[str, np.ndarray]]:
    """Score and time each backend on the host: (rows, outputs by backend). The first
    backend's outputs are the reference every row's agreement is measured against; before
    anything is timed they must have a class for every label of `samples_path`."""
    import torch

    from bnnexport.runs import require_labels_fit

    x1 = np.ascontiguousarray(inputs[:1])
    results: list[BackendResult] = []
    host_outputs: dict[str, np.ndarray] = {}
    torch_threads = torch.get_num_threads()
    try:
        for name, path, factory in _progress(backends, progress):
            predict, call = factory(x1)
            outputs = np.asarray(predict(inputs), np.float32).reshape(len(inputs), -1)
            if not host_outputs and samples_path is not None:
                require_labels_fit(labels, outputs.shape[1], samples_path)
            reference = host_outputs.get(backends[0][0], outputs)
            host_outputs[name] = outputs
            latency = time_calls(call, options.runs, options.warmup)
            results.append(score(name, "host", path, outputs, labels, reference, latency))
    finally:
        torch.set_num_threads(torch_threads)
    return results, host_outputs


def host_identity() -> dict[str, str]:
    """This machine, as bench reports it."""
    return {
        "uname": " ".join(part for part in platform.uname() if part),
        "machine": platform.machine(),
        "cpu_model": host_cpu(),
        "python": platform.python_version(),
    }


def _require_flatbuffer(path: Path) -> None:
    from converters.errors import InvalidModelError
    from converters.runtimes import read_flatbuffer

    try:
        read_flatbuffer(path)
    except InvalidModelError as error:
        raise InvalidModelError(f"{path}: {error}") from None


def _progress(backends: list, show: bool) -> Any:
    """The backends, as a progress bar on stderr that names the one being measured."""
    if not show:
        return backends
    from tqdm import tqdm

    def named() -> Any:
        bar = tqdm(backends, desc="bench", unit="backend", leave=False)
        for item in bar:
            bar.set_postfix_str(item[0])
            yield item

    return named()


def _file_sizes(run: RunDir, target: str) -> dict[str, int]:
    """Bytes of each model file present (checkpoint.pt also holds optimizer state)."""
    names = [
        "checkpoint.pt",
        "model.safetensors",
        "model.onnx",
        "model-float.tflite",
        run.flatbuffer(target).name,
    ]
    return {n: (run.root / n).stat().st_size for n in names if (run.root / n).is_file()}


def host_cpu() -> str:
    """The CPU model name from /proc/cpuinfo (the platform string where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


MODEL_SUFFIXES = (".tflite", ".onnx")


def model_family(path: Path, target: str = "arm64") -> tuple[Path | None, Path | None]:
    """(ONNX model, LCE flatbuffer) to bench for a model file: the file itself, and its partner
    when bnnexport's manifest records one made from the other and it is current (a
    `convert MODEL.onnx` or `convert_module` output: MODEL-TARGET.tflite from MODEL.onnx)."""
    from bnnexport.files import entries
    from bnnexport.provenance import stale_reason

    if path.suffix == ".onnx":
        partner = path.with_name(f"{path.stem}-{target}.tflite")
        current = partner.is_file() and stale_reason(path.parent, partner.name) is None
        made_from = entries(path.parent).get(partner.name, {}).get("sources", {})
        return path, partner if current and path.name in made_from else None
    sources = entries(path.parent).get(path.name, {}).get("sources", {})
    onnx_sources = [path.parent / name for name in sources if name.endswith(".onnx")]
    if onnx_sources and stale_reason(path.parent, path.name) is None:
        return onnx_sources[0], path
    return None, path


def bench_model_file(
    path: str | Path,
    options: BenchOptions = BenchOptions(),
    device: DeviceTarget | None = None,
    samples_file: str | Path | None = None,
    write_report: bool = True,
    progress: bool = False,
) -> BenchReport:
    """`bench` for a model file that is not in a run directory: an LCE flatbuffer or an ONNX
    model (with its partner when `model_family` finds one: ONNX Runtime is then the reference).

    Samples come from `samples_file` (.npz with `inputs`, NCHW float32, and optional `labels`),
    else they are standard-normal inputs of the model's input shape: the report says so
    (`random_inputs`), and there is no accuracy without labels. On `device`, the flatbuffer's
    latency (and, with the python runner, its outputs); `lce_benchmark_model` gives latency,
    op profile and peak memory only, since accuracy there needs a run's batched copy (batch N).
    Writes MODEL-bench.json and (with `write_report`) MODEL-report.md and MODEL-bench_*.png
    next to the file."""
    from bnnexport.runs import read_samples_file

    path = Path(path)
    if path.suffix not in MODEL_SUFFIXES or not path.is_file():
        raise CheckpointError(f"no such run directory, flatbuffer or ONNX file: {path}")
    outputs_of = _file_outputs(path)
    for written in outputs_of.values():
        files.require_replaceable(written)
    onnx_path, flatbuffer = model_family(path, options.target)
    backends = [(name, p, factory) for name, p, factory in (
        ("onnxruntime", onnx_path, functools.partial(_onnxruntime, onnx_path, options.threads)),
        ("lce", flatbuffer, functools.partial(_lce, flatbuffer, options.threads)),
    ) if p is not None]  # fmt: skip
    if flatbuffer is not None:
        _require_flatbuffer(flatbuffer)
    shape = _input_shape(onnx_path, flatbuffer)
    if samples_file is not None:
        inputs, labels = read_samples_file(samples_file, options.samples)
        from converters.runtimes import check_input_shape

        check_input_shape(shape, inputs, str(path))
    else:
        rng = np.random.default_rng(0)
        inputs = rng.standard_normal((options.samples or 100, *shape[1:])).astype(np.float32)
        labels = np.full(len(inputs), -1, np.int64)
    connected = None
    if device is not None:
        if flatbuffer is None:
            raise CheckpointError(f"{path}: a device runs the LCE flatbuffer; convert it first")
        connected = Connected(*reach_device(device), flatbuffer)
    results, host_outputs = _measure_host(backends, inputs, labels, options, progress, samples_file)
    reference = host_outputs[results[0].name]
    identity = profile = None
    if device is not None and connected is not None:
        identity = connected.identity
        results += file_device_rows(connected, device, options, Scoring(inputs, labels, reference))
        if device.profile:
            profile = device_profile(results, connected.flatbuffer, onnx_path)
    report = BenchReport(
        run_dir=str(path), samples=len(inputs), runs=options.runs, threads=options.threads,
        num_classes=int(reference.shape[1]), host=host_identity(), backends=results,
        device=identity, files={p.name: p.stat().st_size for _, p, _ in backends},
        random_inputs=samples_file is None, profile=profile,
    )  # fmt: skip
    _save_results(report, outputs_of["json"], write_report, prefix=f"{path.stem}-")
    return report


def _file_outputs(path: Path) -> dict[str, Path]:
    """What `bench_model_file` writes next to the model, named after it."""
    return {
        "json": path.with_name(f"{path.stem}-bench.json"),
        "report": path.with_name(f"{path.stem}-report.md"),
    }


def _input_shape(onnx_path: Path | None, flatbuffer: Path | None) -> list[int]:
    """The model's input shape (NCHW: bnnexport's flatbuffers take the ONNX model's layout)."""
    if onnx_path is not None:
        from converters.runtimes import ort_session

        return [
            d if isinstance(d, int) else 1 for d in ort_session(onnx_path).get_inputs()[0].shape
        ]
    from converters.runtimes import lce_interpreter

    return [int(d) for d in lce_interpreter(flatbuffer, 1).input_shapes[0]]
