"""Latency and accuracy on a device with the stock `lce_benchmark_model` (no Python needed there).

LCE has no pip wheel for aarch64, so a Raspberry Pi cannot run the `python` runner. The benchmark
tool itself can compute outputs (docs/LCE_NOTES.md "aarch64 device"):
`--input_layer_value_files=x:PATH` feeds a raw file of exactly the input tensor's bytes and
`--output_filepath=PATH` writes the raw bytes of every output after the run. Its input shape is
fixed by the flatbuffer, so accuracy needs a flatbuffer converted at batch N
(`model-arm64-bN.tflite`): the samples go up as ONE raw float32 file (padded to a multiple of N)
in the copy's own input layout (`Samples.fed()`: N,H,W,C for an NHWC flatbuffer, bnnexport's
default), are cut into N-sample chunks on the device (`split`), and each chunk is one invocation
with

    --graph=MODEL-bN --input_layer=x --input_layer_shape=N,H,W,C --input_layer_value_files=x:CHUNK
    --output_filepath=CHUNK.out --num_runs=1 --warmup_runs=0 --warmup_min_secs=0 --min_secs=0
    --enable_op_profiling=false --num_threads=T

The chunks' outputs are concatenated on the device and come back as one file. Each invocation
loads the model once: the cost is one model load per chunk. A binary without `--output_filepath`
(LCE <= 0.7; its `--help` does not list it) gets a note and latency only. Everything happens in
one temporary directory on the device, removed in every case.

Example:
    >>> from bnnexport.deploy.ssh import SshClient
    >>> client = SshClient("pi@raspberrypi.local")                          # doctest: +SKIP
    >>> job = AccuracyJob(Path("model-arm64-b64.tflite"), inputs, batch=64,
    ...                   outputs_per_sample=10)                              # doctest: +SKIP
    >>> run = run_on_device(client, "model-arm64.tflite", DeviceOptions(threads=4),
    ...                     job)                                                  # doctest: +SKIP
    >>> run.result.mean_ms, run.outputs.shape, run.invocations                # doctest: +SKIP
    (14.2, (1000, 10), 16)
"""

from __future__ import annotations

import dataclasses
import shlex
import tempfile
import time
from pathlib import Path

import numpy as np
from bnnexport.deploy.connection import Connection
from bnnexport.deploy.errors import DeviceError, RemoteCommandError
from bnnexport.deploy.runners.lce_benchmark_model.benchmark_tool import (
    BINARY_NAME,
    BenchmarkResult,
    ToolIdentity,
    benchmark_command,
    parse_benchmark_output,
    staged_graph,
)

INPUT_NAME = "x"  # binding is by position; a neutral name needs no ':' escaping
OUTPUT_FLAG = "--output_filepath"
_CHUNK = "\0chunk\0"  # placeholder for the loop variable in chunk_script
ONE_PASS = (
    "--num_runs=1",
    "--warmup_runs=0",
    "--warmup_min_secs=0",
    "--min_secs=0",
    "--enable_op_profiling=false",
)


@dataclasses.dataclass
class DeviceOptions:
    """How to run `lce_benchmark_model` on the device."""

    threads: int = 1
    runs: int = 100
    warmup_runs: int = 10
    binary: str | Path | None = None  # a local binary to upload; None: the device's own
    timeout: float = 600.0  # seconds each command on the device may run
    op_profiling: bool = True
    use_indirect_bgemm: bool | None = None
    use_xnnpack: bool | None = None  # None: the tool's default (XNNPACK for float ops)


@dataclasses.dataclass
class AccuracyJob:
    """The samples to run on the device and the batch-N flatbuffer to run them with.

    `inputs` are float32 in the flatbuffer's input layout, one sample per row; the flatbuffer
    takes exactly `batch` of them and has one float32 output of `outputs_per_sample` values each.
    """

    flatbuffer: Path
    inputs: np.ndarray
    batch: int
    outputs_per_sample: int

    @property
    def chunks(self) -> int:
        return -(-len(self.inputs) // self.batch)

    def raw_inputs(self) -> bytes:
        """All samples, zero-padded to whole chunks, as C-order little-endian float32."""
        padded = np.zeros((self.chunks * self.batch, *self.inputs.shape[1:]), "<f4")
        padded[: len(self.inputs)] = self.inputs
        return padded.tobytes(order="C")

    def input_shape(self) -> str:
        return ",".join(str(d) for d in (self.batch, *self.inputs.shape[1:]))


@dataclasses.dataclass
class DeviceRun:
    """What the device did: latency (batch 1) and, when it could, the outputs on every sample."""

    result: BenchmarkResult
    raw: str  # what the latency run printed
    outputs: np.ndarray | None = None  # (samples, outputs_per_sample) float32
    invocations: int = 0  # one per chunk, each loading the model once
    note: str | None = None  # why there are no outputs, when there are none
    accuracy_seconds: float | None = None  # wall time of upload, all chunks and fetch
    tool: ToolIdentity | None = None  # which lce_benchmark_model ran


def accuracy_command(
    binary: str, graph: str, chunk: str, job: AccuracyJob, options: DeviceOptions
) -> list[str]:
    """The argv of one pass over one chunk, writing `chunk`.out."""
    argv = [
        binary,
        f"--graph={graph}",
        f"--input_layer={INPUT_NAME}",
        f"--input_layer_shape={job.input_shape()}",
        f"--input_layer_value_files={INPUT_NAME}:{chunk}",
        f"{OUTPUT_FLAG}={chunk}.out",
        f"--num_threads={options.threads}",
        *ONE_PASS,
    ]
    if options.use_xnnpack is not None:
        argv.append(f"--use_xnnpack={str(options.use_xnnpack).lower()}")
    if options.use_indirect_bgemm is not None:
        argv.append(f"--use_indirect_bgemm={str(options.use_indirect_bgemm).lower()}")
    return argv


def chunk_script(binary: str, graph: str, job: AccuracyJob, options: DeviceOptions) -> str:
    """The POSIX shell script that cuts samples.f32 into chunks, runs each, joins the outputs.

    Run in the working directory; leaves outputs.f32 there, or fails with the tool's last line.
    """
    chunk_bytes = len(job.raw_inputs()) // job.chunks
    # the chunk's name is the loop variable: quote everything around it, never "$c" itself
    run_one = " ".join(
        '"$c"'.join(shlex.quote(part) if part else "" for part in arg.split(_CHUNK))
        for arg in accuracy_command(binary, graph, _CHUNK, job, options)
    )
    return "\n".join(
        [
            "set -e",
            # letter suffixes of a fixed length sort as the chunks were cut; no `-d`, which
            # Android's toybox `split` lacks (docs/LCE_NOTES.md, ADB)
            f"split -b {chunk_bytes} -a 6 samples.f32 chunk.",
            "rm samples.f32",
            ": > outputs.f32",
            "for c in chunk.*; do",
            f'  if ! {run_one} > "$c.log" 2>&1; then',
            "    why=''  # the tool's last error line; plain sh, nothing beyond coreutils needed",
            '    while IFS= read -r line; do case "$line" in *ERROR*|*rror*) why="$line";; esac',
            '    done < "$c.log"',
            '    echo "$c: ${why:-$(tail -n 1 "$c.log")}" >&2; exit 1',
            "  fi",
            '  [ -f "$c.out" ] || { echo "$c: no output file written" >&2; exit 1; }',
            '  cat "$c.out" >> outputs.f32',
            '  rm -f "$c" "$c.out" "$c.log"',
            "done",
        ]
    )


def supports_output_file(client: Connection, remote_binary: str, timeout: float = 120.0) -> bool:
    """True when the binary's `--help` lists --output_filepath (LCE <= 0.7 does not)."""
    done = client.run(
        [remote_binary, "--help"],
        timeout=timeout,
        check=False,
        merge_stderr=True,
        limit_remote=True,
    )
    return OUTPUT_FLAG.lstrip("-") in done.stdout


def _device_outputs(
    client: Connection, work: str, remote_binary: str, job: AccuracyJob, options: DeviceOptions
) -> np.ndarray:
    graph = f"{work}/{job.flatbuffer.name}"
    client.put(job.flatbuffer, graph)
    with tempfile.TemporaryDirectory(prefix="bnnexport-device-") as local:
        samples = Path(local) / "samples.f32"
        samples.write_bytes(job.raw_inputs())
        client.put(samples, f"{work}/samples.f32")
        script = chunk_script(remote_binary, graph, job, options)
        done = client.run(script, timeout=options.timeout, cwd=work, limit_remote=True, check=False)
        if done.returncode != 0:
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            raise RemoteCommandError(
                f"{BINARY_NAME} failed on {client.destination} computing outputs on "
                f"{lines[-1] if lines else 'a chunk (no message)'}"
            )
        client.get(f"{work}/outputs.f32", Path(local) / "outputs.f32")
        data = (Path(local) / "outputs.f32").read_bytes()
    expected = job.chunks * job.batch * job.outputs_per_sample * 4
    if len(data) != expected:
        raise DeviceError(
            f"the outputs from {client.destination} have {len(data)} bytes, expected {expected} "
            f"({job.chunks} chunks x {job.batch} samples x {job.outputs_per_sample} float32): "
            "does the batch flatbuffer have exactly one float32 output?"
        )
    outputs = np.frombuffer(data, "<f4").reshape(-1, job.outputs_per_sample)
    return outputs[: len(job.inputs)].astype(np.float32)


def run_on_device(
    client: Connection,
    flatbuffer: str | Path,
    options: DeviceOptions,
    accuracy: AccuracyJob | None = None,
) -> DeviceRun:
    """Benchmark `flatbuffer` (batch 1) and, with `accuracy`, compute its outputs on the device.

    One temporary directory on the device holds the binary (if uploaded), both flatbuffers and
    the samples; it is removed in every case. Errors are `deploy.errors` exceptions.
    """
    with staged_graph(client, flatbuffer, options.binary or None) as staged:
        work, remote_binary = staged.work, staged.binary
        argv = benchmark_command(
            remote_binary,
            staged.graph,
            options.threads,
            options.runs,
            options.warmup_runs,
            options.op_profiling,
            max_secs=options.timeout,
            use_indirect_bgemm=options.use_indirect_bgemm,
        )
        done = client.run(
            argv, timeout=options.timeout, cwd=work, merge_stderr=True, limit_remote=True
        )
        run = DeviceRun(parse_benchmark_output(done.stdout), done.stdout, tool=staged.tool)
        if accuracy is None:
            return run
        if not supports_output_file(client, remote_binary):
            run.note = (
                f"{remote_binary} on {client.destination} has no {OUTPUT_FLAG} "
                "(LCE <= 0.7): accuracy not measured on the device, latency only"
            )
            return run
        start = time.perf_counter()
        run.outputs = _device_outputs(client, work, remote_binary, accuracy, options)
        run.accuracy_seconds = time.perf_counter() - start
        run.invocations = accuracy.chunks
    return run
