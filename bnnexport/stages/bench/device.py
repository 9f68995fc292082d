"""The device rows of `bench`: reach the device, pick its runner, score what the runner measured.

`bench --device` runs the LCE flatbuffer through one of the runners of `deploy.runners`, picked
by name (`auto`: the first the device can run) and called through their one protocol; nothing
here knows a runner by name. Latency comes from the batch-1 flatbuffer (`model-arm64.tflite`).
A runner whose outputs need a batched copy (`lce_benchmark_model`) gets the batch-N copy
(`model-arm64-bN.tflite`, written by `bnnexport convert RUN_DIR --batched-copy N`) and runs all
samples in N-sample chunks; N is `min(batch, samples)`, 64 by default. The device's outputs are
scored against PyTorch (row `lce`) and, when they came from the batched copy, against the host's
LCE interpreter on the same flatbuffer family (row `lce vs host lce`); a run's int8 flatbuffer
(`model-arm64-int8.tflite`, with its own batched copy) gets the rows `lce-int8` and
`lce-int8 vs host lce-int8` the same way. Without the copy, or with
a binary that has no `--output_filepath`, the device row has latency only and a one-line note
says why. The samples go to the runner with the input layout the flatbuffer it feeds declares
(`Samples.input_layout`, read here from its metadata): the runner puts them in it.

Example:
    >>> from bnnexport.stages.bench.device import copy_batch
    >>> copy_batch(1000, 64), copy_batch(40, 64)
    (64, 40)
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bnnexport.converters.batch import batched_path
from bnnexport.errors import CheckpointError
from bnnexport.run.directory import RunDir
from bnnexport.stages.bench.scoring import BackendResult, score

if TYPE_CHECKING:
    from bnnexport.deploy.connection import Connection
    from bnnexport.deploy.runners import DeviceRunner, Measurement, RunSettings, Samples
    from bnnexport.stages.bench.options import BenchOptions, DeviceTarget

DEFAULT_BATCH = 64
FILE_NOTE = "latency only: accuracy on the device needs a run's batched copy (batch N)"


def copy_batch(samples: int, batch: int = DEFAULT_BATCH) -> int:
    """The chunk size used on the device: `batch`, capped by the number of samples."""
    return max(1, min(batch, samples))


@dataclasses.dataclass
class Connected:
    """A device reached and checked before any host work: its client, identity and runner, and
    what LCE must be told to run the flatbuffer (`lce_settings`: {} for its defaults)."""

    client: Connection
    identity: dict[str, Any]
    runner: DeviceRunner
    flatbuffer: Path
    lce_settings: dict[str, bool] = dataclasses.field(default_factory=dict)


def connect(device: DeviceTarget, flatbuffer: Path) -> Connected:
    """Reach the device (`reach_device`) and read, on this host, which LCE settings the
    flatbuffer needs: a grouped LceBconv2d (another tool's flatbuffer; bnnexport writes one
    per group) fails to prepare with LCE's default kernels, so the runner is told to take
    indirect BGEMM, and a note says so (docs/LCE_NOTES.md "Grouped convolutions")."""
    from bnnexport.converters.runtimes import lce_kernel_settings

    needed = lce_kernel_settings(flatbuffer)
    if needed.flags:
        flags = ", ".join(f"{k}={v}" for k, v in needed.flags.items())
        print(
            f"bnnexport: note: {flatbuffer.name} needs {flags} (LCE's default kernels refuse "
            f"it: {needed.refusal}); the device runs it so",
            file=sys.stderr,
        )
    return Connected(*reach_device(device), flatbuffer, dict(needed.flags))


@dataclasses.dataclass(frozen=True)
class Scoring:
    """What the device's outputs are scored against: the host's samples and outputs."""

    inputs: np.ndarray
    labels: np.ndarray
    reference: np.ndarray  # PyTorch's (or ONNX Runtime's, for a model file) outputs
    host_lce: np.ndarray | None = None  # the host LCE interpreter's, on the same samples


def run_settings(
    device: DeviceTarget,
    options: BenchOptions | None = None,
    threads: int | None = None,
    lce: dict[str, bool] | None = None,
) -> RunSettings:
    """How the runner runs the flatbuffer: `options`' runs and threads (or `threads`), the
    device's timeout, benchmark binary and Python, and the LCE settings `lce` the flatbuffer
    needs (`Connected.lce_settings`)."""
    from bnnexport.deploy.runners import RunSettings

    measured: dict[str, Any] = {"use_indirect_bgemm": (lce or {}).get("use_indirect_bgemm")}
    if options is not None:
        measured.update(threads=options.threads, runs=options.runs, warmup=options.warmup)
    if threads is not None:
        measured["threads"] = threads
    return RunSettings(
        **measured,
        timeout=device.timeout,
        benchmark_binary=device.benchmark_binary,
        remote_python=device.remote_python,
    )


def needs_batched_copy(device: DeviceTarget) -> bool:
    """Whether the device's runner may need the batched copy: its own runner, or for `auto`
    any runner it may pick (the device is not asked here)."""
    from bnnexport.deploy.runners import candidates

    return any(runner.batched_copy for runner in candidates(device.runner, device.profile))


def reach_device(device: DeviceTarget) -> tuple[Connection, dict[str, Any], DeviceRunner]:
    """Reach the device by its transport and check what will run there: (connection,
    identity, runner). A wrong host name or serial, a refused key or a benchmark binary of
    another architecture fails here in seconds, one line (DeviceError /
    WrongArchitectureError), before any long work."""
    from bnnexport.deploy.runners import pick_runner
    from bnnexport.deploy.transports import open_device

    client = open_device(device.address, device.reach())
    identity = {"destination": client.destination, **client.identity().to_json()}
    settings = run_settings(device)
    runner = pick_runner(device.runner, client, settings, profile=device.profile)
    runner.preflight(identity["machine"], settings)
    return client, identity, runner


def ensure_batched_copy(
    run_dir: Path, target: str, samples: int, batch: int, progress: bool, int8: bool = False
) -> None:
    """Convert the batched copy (batch N) that accuracy on the device runs, when it is missing
    or was made from another model.onnx (as `convert --batched-copy N` does); with `int8`, the
    int8 flatbuffer's (the same int8 model: its conversion's ranges)."""
    from bnnexport.run.provenance import stale_reason
    from bnnexport.stages.convert import convert_batched_copy

    batch = copy_batch(samples, batch)
    copy = batched_path(RunDir(run_dir).flatbuffer(target, int8), batch)
    if copy.is_file() and stale_reason(run_dir, copy.name) is None:
        return
    convert_batched_copy(run_dir, target, batch, progress=progress, int8=int8)


def _check_copy(copy: Path, inputs: np.ndarray, batch: int) -> None:
    """Raise CheckpointError unless the copy takes exactly `batch` samples of the inputs' shape
    (NCHW: an NHWC copy's shape is compared in NCHW)."""
    from bnnexport.converters.flatbuffer import input_layout, input_shapes, nchw_shape

    shape = nchw_shape(input_shapes(copy)[0], input_layout(copy))
    expected = [batch, *inputs.shape[1:]]
    if shape != expected:
        raise CheckpointError(
            f"{copy} takes input {shape}, bench needs {expected}: convert it again with "
            f"`bnnexport convert {copy.parent} --batched-copy {batch}`"
        )


def _samples(
    runner: DeviceRunner, flatbuffer: Path, scoring: Scoring, batch: int
) -> tuple[Samples, str | None]:
    """The samples for the runner, with the batched copy where its outputs need one, and a
    note when that copy is missing."""
    from bnnexport.converters.flatbuffer import input_layout
    from bnnexport.deploy.runners import Samples

    per_sample = int(scoring.reference.shape[1])
    if not runner.batched_copy:
        layout = input_layout(flatbuffer)
        return Samples(scoring.inputs, scoring.labels, per_sample, input_layout=layout), None
    batch = copy_batch(len(scoring.inputs), batch)
    copy = batched_path(flatbuffer, batch)
    if not copy.is_file():
        int8 = " --float-layers int8" if flatbuffer.stem.endswith("-int8") else ""
        note = (
            f"no batch-{batch} copy {copy.name}: accuracy not measured on the device, latency "
            f"only (`bnnexport convert {flatbuffer.parent} --batched-copy {batch}{int8}` writes "
            "it)"
        )
        return Samples(scoring.inputs, scoring.labels, per_sample, None, batch), note
    _check_copy(copy, scoring.inputs, batch)
    layout = input_layout(copy)  # the copy is what the runner feeds the samples
    return Samples(scoring.inputs, scoring.labels, per_sample, copy, batch, layout), None


def device_rows(
    connected: Connected,
    device: DeviceTarget,
    options: BenchOptions,
    scoring: Scoring,
    name: str = "lce",
) -> tuple[list[BackendResult], str | None]:
    """Run `connected.flatbuffer` on the device: its row `name` (and `NAME vs host NAME` when
    the outputs came from the batched copy, which sits beside it), and what the device printed
    (None: nothing to keep)."""
    runner, where = connected.runner, connected.client.destination
    samples, note = _samples(runner, connected.flatbuffer, scoring, device.batch)
    settings = run_settings(device, options, lce=connected.lce_settings)
    measured = _labelled(
        runner.measure(connected.client, connected.flatbuffer, settings, samples), connected
    )
    note = measured.note or note
    if note:
        measured.extra["note"] = note
    labels, outputs = scoring.labels, measured.outputs
    rows = [
        score(name, where, connected.flatbuffer, outputs, labels, scoring.reference,
              measured.latency, measured.extra)
    ]  # fmt: skip
    if outputs is not None and scoring.host_lce is not None and samples.copy is not None:
        versus = {"reference": f"host {name}", "emulated": measured.extra["emulated"],
                  **steps_apart(samples.copy, outputs, scoring.host_lce)}  # fmt: skip
        rows.append(score(f"{name} vs host {name}", where, samples.copy, outputs, labels,
                          scoring.host_lce, {}, versus))  # fmt: skip
        if versus["max_steps"]:
            print(f"bnnexport: note: {int8_note(name, versus)}", file=sys.stderr)
    if note:
        print(f"bnnexport: note: {note}", file=sys.stderr)
    return rows, measured.raw


def scaling_rows(
    connected: Connected,
    device: DeviceTarget,
    options: BenchOptions,
    scoring: Scoring,
    counts: tuple[int, ...] | None = None,
) -> list[BackendResult]:
    """One row per thread count (`lce (N threads)`; default `options.scaling_threads`): the
    batch-1 flatbuffer's latency on the device, scored where the runner's timing run also
    gave the outputs."""
    counts = options.scaling_threads if counts is None else counts
    return [_latency_row(connected, device, options, scoring, count) for count in counts]


def _latency_row(
    connected: Connected,
    device: DeviceTarget,
    options: BenchOptions,
    scoring: Scoring,
    threads: int,
) -> BackendResult:
    """The runner's latency at `threads`, with the samples it may score on the way."""
    from bnnexport.converters.flatbuffer import input_layout
    from bnnexport.deploy.runners import Samples

    per_sample, layout = int(scoring.reference.shape[1]), input_layout(connected.flatbuffer)
    samples = Samples(scoring.inputs, scoring.labels, per_sample, input_layout=layout)
    settings = run_settings(device, options, threads, connected.lce_settings)
    measured = connected.runner.latency(connected.client, connected.flatbuffer, settings, samples)
    return _scored(f"lce ({threads} threads)", connected, _labelled(measured, connected), scoring)


def _labelled(measured: Measurement, connected: Connected) -> Measurement:
    """A device row's provenance in its fields: the LCE settings it ran with, and why its
    latency is emulated (None: nothing says so; `deploy.connection.emulation`)."""
    measured.extra["lce_settings"] = connected.lce_settings
    measured.extra["emulated"] = connected.identity.get("emulated")
    return measured


def steps_apart(copy: Path, outputs: np.ndarray, host: np.ndarray) -> dict[str, Any]:
    """How far the device's outputs of an int8 flatbuffer are from the host's, in steps of its
    int8 output (`output_step`; None for a float output): the most, on how many samples any,
    and how many binarizations read a dequantized tensor (`binarized_dequantized`). LCE's ARM
    and x86 builds compute int8 differently (docs/LCE_NOTES.md "int8 on ARM"), so whole steps
    are expected; a binarization of a dequantized tensor may take the other sign on ARM.

    Example:
        >>> steps_apart(Path("model-arm64-b40.tflite"), device, host)  # doctest: +SKIP
        {'output_step': 0.0421, 'max_steps': 3, 'samples_differing': 5, ...}
    """
    from bnnexport.converters.flatbuffer import flatbuffer_ops, output_step

    ops = flatbuffer_ops(copy)
    dequantized = {op.outputs[0] for op in ops if op.op_type == "DEQUANTIZE" and op.outputs}
    read = sum(1 for op in ops if op.op_type == "LceQuantize" and op.inputs[0] in dequantized)
    found = {"output_step": output_step(copy), "max_steps": None, "samples_differing": None,
             "binarized_dequantized": read}  # fmt: skip
    if found["output_step"] is None:
        return found
    steps = np.abs(outputs.astype(np.float64) - host) / found["output_step"]
    steps = np.rint(steps).reshape(len(outputs), -1)
    found.update(max_steps=int(steps.max(initial=0)),
                 samples_differing=int((steps.max(axis=1, initial=0) > 0).sum()))  # fmt: skip
    return found


def int8_note(name: str, versus: dict[str, Any]) -> str:
    """One line on an int8 flatbuffer's device outputs some whole steps from the host's."""
    dequantized = versus.get("binarized_dequantized") or 0
    sign = (
        f"; {dequantized} binarization(s) here read a dequantized tensor, where ARM's DEQUANTIZE "
        "leaves a value at the zero point a residue of about 1e-9 of either sign (the host: 0), "
        "so those signs may differ"
        if dequantized
        else ""
    )
    return (
        f"{name} on the device is up to {versus['max_steps']} int8 output step(s) of "
        f"{versus['output_step']:.4g} from the host's LCE on {versus['samples_differing']} "
        "sample(s): LCE's ARM build computes int8 so (it rounds requantization ties away from "
        f'zero, its x86 build rounds them up{sign}; docs/LCE_NOTES.md "int8 on ARM"), not a '
        "fault of the flatbuffer"
    )


def _scored(
    name: str, connected: Connected, measured: Measurement, scoring: Scoring
) -> BackendResult:
    """A latency row: scored on the samples when it has outputs, else a row of no samples."""
    has = measured.outputs is not None
    labels = scoring.labels if has else np.zeros(0)
    reference = scoring.reference if has else None
    where, flatbuffer = connected.client.destination, connected.flatbuffer
    return score(name, where, flatbuffer, measured.outputs, labels, reference, measured.latency,
                 measured.extra)  # fmt: skip


def file_device_rows(
    connected: Connected, device: DeviceTarget, options: BenchOptions, scoring: Scoring
) -> list[BackendResult]:
    """A model file's flatbuffer on the device, one row per thread count, the first named
    `lce`. A runner whose outputs need a run's batched copy gives latency only (a note)."""
    rows = scaling_rows(
        connected, device, options, scoring, (options.threads, *options.scaling_threads)
    )
    rows[0].name = "lce"
    if connected.runner.batched_copy:
        rows[0].extra["note"] = FILE_NOTE
    return rows


def device_profile(
    rows: list[BackendResult], flatbuffer: Path, onnx_path: Path | None, name: str = "lce"
) -> dict[str, Any]:
    """The op profile of the device's batch-1 latency run (the row `name`: same runs and
    threads), by PyTorch layer (`bnnexport.stages.bench.profile`), as JSON. A missing or unreadable
    profile is a note in it (and on stderr), never an error: the latency rows stand without it."""
    from bnnexport.converters.errors import ConverterError
    from bnnexport.stages.bench.profile import DeviceProfile, profile_by_layer

    row = next((r for r in rows if r.name == name and r.where != "host"), None)
    ops = row.extra.get("ops") if row is not None else None
    threads = row.extra.get("threads") if row is not None else None
    profile = DeviceProfile([], 0.0, threads)
    if not ops:
        profile.notes.append("lce_benchmark_model printed no op profile table")
    else:
        onnx_model = onnx_path if onnx_path is not None and onnx_path.is_file() else None
        try:
            profile = profile_by_layer(ops, flatbuffer, onnx_model)
            profile.threads = threads
        except (ConverterError, KeyError, TypeError, ValueError) as error:
            profile.notes.append(f"the op profile could not be matched to layers ({error})")
    for note in profile.notes:
        print(f"bnnexport: note: profile: {note}", file=sys.stderr)
    return {**profile.to_json(), "summary": profile.summary()}
