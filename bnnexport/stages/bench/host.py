"""The host half of a bench: each backend of a run opened, scored on the samples and timed.

A backend is a pair of callables: its outputs on any batch, and the batch-1 call the timing
repeats (`time_calls`: warm-up, then the given number of timed runs).

Example:
    >>> stats = time_calls(lambda: None, runs=5, warmup=1)
    >>> sorted(stats)
    ['mean', 'median', 'min', 'p90', 'runs', 'std']
"""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bnnexport.errors import CheckpointError
from bnnexport.run.checkpoint import load_model
from bnnexport.run.directory import EXPORT_HINT, RunDir
from bnnexport.stages.bench.options import BenchOptions
from bnnexport.stages.bench.scoring import BackendResult, score

CONVERT_HINT = "run `bnnexport convert {run} --target {target} --format tflite` first"


def require(path: Path, hint: str) -> Path:
    if not path.is_file():
        raise CheckpointError(f"{path} not found: {hint}")
    return path


def time_calls(call: Callable[[], Any], runs: int, warmup: int) -> dict[str, float]:
    """Call `call` `warmup` times untimed, then `runs` times timed; latency stats in ms."""
    from bnnexport.deploy.runners.python.device_script import (
        latency_stats,  # the same as on the device
    )

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
    backends = [
        ("pytorch", run.checkpoint, functools.partial(pytorch_backend, run, threads)),
        ("onnxruntime", run.onnx, functools.partial(onnxruntime_backend, run.onnx, threads)),
        ("tflite-float", float_path, functools.partial(tflite_float_backend, float_path, threads)),
        ("lce", lce_path, functools.partial(lce_backend, lce_path, threads)),
    ]
    int8_path = run.flatbuffer(target, int8=True)
    if int8_path.is_file():  # `convert --float-layers int8`: beside the float row
        backends.append((INT8, int8_path, functools.partial(lce_backend, int8_path, threads)))
    return backends


INT8 = "lce-int8"  # the flatbuffer whose float layers run in int8


Factory = tuple[Callable[[np.ndarray], np.ndarray], Callable[[], Any]]


def pytorch_backend(run: RunDir, threads: int, x1: np.ndarray) -> Factory:
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


def onnxruntime_backend(onnx_path: Path, threads: int, x1: np.ndarray) -> Factory:
    from bnnexport.converters.errors import InvalidModelError
    from bnnexport.converters.runtimes import open_model

    model = open_model("onnxruntime", onnx_path, threads)
    inputs = model.session.get_inputs()
    if len(inputs) != 1:  # bench feeds one image tensor, as every exported BNN takes
        names = ", ".join(i.name for i in inputs)
        raise InvalidModelError(
            f"{onnx_path} has {len(inputs)} inputs ({names}); bench runs models with one input"
        )
    x = model.feed(x1)
    return model.run, (lambda: model.run_one(x))


def tflite_float_backend(float_path: Path, threads: int, x1: np.ndarray) -> Factory:
    from bnnexport.converters.runtimes import open_model

    model = open_model("tflite", float_path, threads)
    x = model.feed(x1)  # in the input layout it declares, before the timing: an app feeds it so
    return model.run, (lambda: model.run_one(x))


def lce_backend(lce_path: Path, threads: int, x1: np.ndarray) -> Factory:
    from bnnexport.converters.runtimes import open_model

    model = open_model("lce", lce_path, threads)  # run_one: one call, no per-sample loop
    x = model.feed(x1)  # in the input layout it declares (NHWC by default), before the timing
    return model.run, (lambda: model.run_one(x))


def usable_backends(
    run: RunDir, backends: list[tuple[str, Path | None, Any]], target: str
) -> tuple[list[tuple[str, Path | None, Any]], dict[str, str]]:
    """The backends whose model file exists and is current (bnnexport.run.provenance), and why
    each other one is skipped. PyTorch, the reference, always stays."""
    from bnnexport.run.provenance import stale_reason

    hints = {"onnxruntime": EXPORT_HINT.format(run=run.root),
             "tflite-float": CONVERT_HINT.format(run=run.root, target=target),
             "lce": CONVERT_HINT.format(run=run.root, target=target).replace(" --format tflite",
                                                                              ""),
             INT8: CONVERT_HINT.format(run=run.root, target=target).replace(
                 " --format tflite", " --float-layers int8")}  # fmt: skip
    from bnnexport.run.checkpoint import recorded_float_layers

    if recorded_float_layers(run.root) == "int8":  # a QDQ model converts to int8 alone
        hints["lce"] = hints["tflite-float"] = (
            "a run trained with --float-layers int8 has its int8 flatbuffer (lce-int8) only"
        )
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
                require_flatbuffer(path)
        usable.append((name, path, factory))
    return usable, skipped


def measure_host(
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

    from bnnexport.run.samples import require_labels_fit

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


def require_flatbuffer(path: Path) -> None:
    from bnnexport.converters.errors import InvalidModelError
    from bnnexport.converters.flatbuffer import read_flatbuffer

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


def host_cpu() -> str:
    """The CPU model name from /proc/cpuinfo (the platform string where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
