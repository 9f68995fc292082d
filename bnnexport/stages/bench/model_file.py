"""Bench a model file of your own: a flatbuffer or an ONNX model outside any run directory,
with a samples file of yours or random inputs of its shape.

Example:
    >>> from pathlib import Path
    >>> model_family(Path("/nowhere/net-arm64.tflite"))
    (None, PosixPath('/nowhere/net-arm64.tflite'))
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from bnnexport.errors import CheckpointError
from bnnexport.run import files
from bnnexport.stages.bench.device import Scoring, connect, device_profile, file_device_rows
from bnnexport.stages.bench.host import (
    host_identity,
    lce_backend,
    measure_host,
    onnxruntime_backend,
    require_flatbuffer,
)
from bnnexport.stages.bench.measure import BenchReport, save_results
from bnnexport.stages.bench.options import BenchOptions, DeviceTarget

MODEL_SUFFIXES = (".tflite", ".onnx")


def model_family(path: Path, target: str = "arm64") -> tuple[Path | None, Path | None]:
    """(ONNX model, LCE flatbuffer) to bench for a model file: the file itself, and its partner
    when bnnexport's manifest records one made from the other and it is current (a
    `convert MODEL.onnx` or `convert_module` output: MODEL-TARGET.tflite from MODEL.onnx)."""
    from bnnexport.run.files import entries
    from bnnexport.run.provenance import stale_reason

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


# what a file bench cannot take is, by its suffix, and what to give instead
_OTHER_FILES = {
    ".png": "an image (`compare` and `bench` draw these)",
    ".jpg": "an image",
    ".md": "a report (`bench` writes report.md)",
    ".json": "a JSON file (a stage's report)",
    ".jsonl": "a metrics file",
    ".pt": "a checkpoint (bench the run directory it is in)",
    ".safetensors": "a packed model (bench the run directory it is in)",
    ".npz": "a samples archive (give it as --samples-file)",
}


def _what_file(path: Path) -> str:
    return _OTHER_FILES.get(path.suffix.lower(), f"a {path.suffix or 'suffix-less'} file")


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

    Samples come from `samples_file` (.npz with `inputs`, NCHW float32, and optional `labels`;
    a flatbuffer that declares NHWC is fed them transposed, one that declares no layout as
    they are), else they are standard-normal inputs of the model's input shape: the report says so
    (`random_inputs`), and there is no accuracy without labels. On `device`, the flatbuffer's
    latency (and, with the python runner, its outputs); `lce_benchmark_model` gives latency,
    op profile and peak memory only, since accuracy there needs a run's batched copy (batch N).
    Writes MODEL-bench.json and (with `write_report`) MODEL-report.md and MODEL-bench_*.png
    next to the file."""
    path = _require_model_file(Path(path))
    outputs_of = _file_outputs(path)
    for written in outputs_of.values():
        files.require_replaceable(written)
    onnx_path, flatbuffer = model_family(path, options.target)
    backends = _file_backends(onnx_path, flatbuffer, options.threads)
    shape = _input_shape(onnx_path, flatbuffer)
    inputs, labels = _file_inputs(path, shape, samples_file, options.samples)
    connected = None
    if device is not None:
        if flatbuffer is None:
            raise CheckpointError(f"{path}: a device runs the LCE flatbuffer; convert it first")
        connected = connect(device, flatbuffer)
    results, host_outputs = measure_host(backends, inputs, labels, options, progress, samples_file)
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
    save_results(report, outputs_of["json"], write_report, prefix=f"{path.stem}-")
    return report


def _require_model_file(path: Path) -> Path:
    """`path`, once it is known to be a model file bench takes: CheckpointError naming what
    it is otherwise (`_what_file`), or that it is not there."""
    if path.is_file() and path.suffix not in MODEL_SUFFIXES:
        raise CheckpointError(
            f"{path} is {_what_file(path)}; bench takes a run directory, an LCE flatbuffer "
            "(.tflite) or an ONNX model (.onnx)"
        )
    if path.suffix not in MODEL_SUFFIXES or not path.is_file():
        raise CheckpointError(f"no such run directory, flatbuffer or ONNX file: {path}")
    return path


def _file_backends(
    onnx_path: Path | None, flatbuffer: Path | None, threads: int
) -> list[tuple[str, Path, functools.partial]]:
    """The host backends of a model family, ONNX Runtime (the reference) first: (name, model
    file, factory) for each file there is. InvalidModelError for a flatbuffer that is none."""
    backends = [(name, p, factory) for name, p, factory in (
        ("onnxruntime", onnx_path, functools.partial(onnxruntime_backend, onnx_path, threads)),
        ("lce", flatbuffer, functools.partial(lce_backend, flatbuffer, threads)),
    ) if p is not None]  # fmt: skip
    if flatbuffer is not None:
        require_flatbuffer(flatbuffer)
    return backends


def _file_inputs(
    path: Path, shape: list[int], samples_file: str | Path | None, samples: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """The samples to feed the model `path` of input `shape` and their labels: those of
    `samples_file` (checked of that shape), else `samples` (default 100) standard-normal
    inputs, unlabelled (-1)."""
    if samples_file is not None:
        from bnnexport.converters.runtimes import check_input_shape
        from bnnexport.run.samples import read_samples_file

        inputs, labels = read_samples_file(samples_file, samples)
        check_input_shape(shape, inputs, str(path))
        return inputs, labels
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((samples or 100, *shape[1:])).astype(np.float32)
    return inputs, np.full(len(inputs), -1, np.int64)


def _file_outputs(path: Path) -> dict[str, Path]:
    """What `bench_model_file` writes next to the model, named after it."""
    return {
        "json": path.with_name(f"{path.stem}-bench.json"),
        "report": path.with_name(f"{path.stem}-report.md"),
    }


def _input_shape(onnx_path: Path | None, flatbuffer: Path | None) -> list[int]:
    """The shape of the samples bench feeds: the ONNX model's input (NCHW), or the
    flatbuffer's in NCHW where it declares NHWC (`RuntimeModel.input_shape`: bnnexport's
    samples are NCHW, and the flatbuffer is fed them in its layout), as it is where it declares
    no layout (another tool's: give samples in its own layout)."""
    if onnx_path is not None:
        from bnnexport.converters.runtimes import ort_session

        return [
            d if isinstance(d, int) else 1 for d in ort_session(onnx_path).get_inputs()[0].shape
        ]
    from bnnexport.converters.flatbuffer import input_layout, input_shapes, nchw_shape

    return nchw_shape(input_shapes(flatbuffer)[0], input_layout(flatbuffer))
