"""`bnnexport bench`."""

from __future__ import annotations

import sys

import click

from bnnexport.cli.common import emit, handle_errors, json_option, locks_run


@click.command("bench", short_help="Accuracy, agreement with PyTorch and latency of every backend.")
@click.argument("run_dir", type=click.Path())
@click.option(
    "--runs",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Timed runs at batch 1 per backend, after --warmup untimed ones.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Untimed runs before timing.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Threads for every runtime (PyTorch, ONNX Runtime, TFLite, LCE, the device).",
)
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Test samples to score: the first N of RUN_DIR/samples.npz.",
)
@click.option(
    "--target",
    type=click.Choice(["arm64", "arm32"]),
    default="arm64",
    show_default=True,
    help="Which LCE flatbuffer: RUN_DIR/model-TARGET.tflite.",
)
@click.option(
    "--device",
    metavar="USER@HOST",
    help="Also run the LCE flatbuffer on this device over SSH (the system's OpenSSH "
    "client: ~/.ssh/config aliases, keys and known_hosts apply).",
)
@click.option("--port", type=click.IntRange(1, 65535), help="SSH port of the device.")
@click.option(
    "--ssh-key",
    type=click.Path(dir_okay=False),
    help="Private key for the device (ssh -i); otherwise ssh's own choice.",
)
@click.option(
    "--ssh-option",
    "ssh_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra ssh option (ssh -o), repeatable, e.g. UserKnownHostsFile=PATH.",
)
@click.option(
    "--runner",
    type=click.Choice(["auto", "python", "lce_benchmark_model"]),
    default="auto",
    show_default=True,
    help="On the device: `python` runs bnnexport's runner (needs python3 with "
    "larq_compute_engine there; also measures accuracy on the samples), "
    "`lce_benchmark_model` runs LCE's benchmark tool (op profile, peak memory), "
    "`auto` picks python when the device has it.",
)
@click.option(
    "--benchmark-binary",
    type=click.Path(dir_okay=False),
    help="Local lce_benchmark_model to upload (e.g. lce_benchmark_model_aarch64); "
    "default: the one on the device's PATH.",
)
@click.option(
    "--remote-python",
    default="python3",
    show_default=True,
    help="Python interpreter on the device for --runner python.",
)
@click.option(
    "--remote-tmp",
    default="/tmp",
    show_default=True,
    help="Directory on the device for the temporary working directory (removed after).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=600,
    show_default=True,
    help="Seconds a command on the device may run before it is stopped.",
)
@click.option(
    "--device-batch",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="With lce_benchmark_model: accuracy on the device runs the batch-N twin "
    "RUN_DIR/model-TARGET-bN.tflite (N = min(this, --samples); written by "
    "`convert --batch-twin N`), one invocation per N samples.",
)
@json_option
@handle_errors
@locks_run("run_dir")
def bench_command(
    run_dir: str,
    runs: int,
    warmup: int,
    threads: int,
    samples: int,
    target: str,
    device: str | None,
    port: int | None,
    ssh_key: str | None,
    ssh_options: tuple[str, ...],
    runner: str,
    benchmark_binary: str | None,
    remote_python: str,
    remote_tmp: str,
    timeout: float,
    device_batch: int,
    as_json: bool,
) -> None:
    """Accuracy, agreement with PyTorch and batch-1 latency of PyTorch, ONNX Runtime, the float
    TFLite model and the LCE flatbuffer of RUN_DIR, on the same test samples; with --device, of
    the LCE flatbuffer on that device too.

    Writes RUN_DIR/bench.json and RUN_DIR/report.md (with plots). Needs samples.npz (from
    `export`); measures each of model.onnx (`export`), model-float.tflite (`convert --format
    tflite`) and model-TARGET.tflite (`convert`) that exists and is current, and lists the
    backends it skipped and why.
    """
    from bnnexport.bench import bench

    report = bench(
        run_dir,
        runs=runs,
        threads=threads,
        samples=samples,
        device=device,
        target=target,
        warmup=warmup,
        port=port,
        ssh_key=ssh_key,
        ssh_options=ssh_options,
        benchmark_binary=benchmark_binary,
        runner=runner,
        remote_python=remote_python,
        remote_tmp=remote_tmp,
        timeout=timeout,
        device_batch=device_batch,
        progress=not as_json and sys.stderr.isatty(),
    )
    emit(report, as_json)
