"""`bnnexport bench`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from bnnexport.cli.common import (
    CountList,
    choice_option,
    count_option,
    emit,
    handle_errors,
    json_option,
    locks_run,
)
from bnnexport.converters.choices import TARGETS
from bnnexport.deploy.runners import candidates, runner_choices, runner_names
from bnnexport.deploy.transports import device_help

if TYPE_CHECKING:
    from bnnexport.stages.bench.options import BenchOptions, DeviceTarget


@click.command("bench", short_help="Accuracy, agreement with PyTorch and latency of every backend.")
@click.argument("run_dir", metavar="RUN_DIR|MODEL", type=click.Path())
@count_option(
    "--runs", default=100, help="Timed runs at batch 1 per backend, after --warmup untimed ones."
)
@count_option("--warmup", minimum=0, default=10, help="Untimed runs before timing.")
@click.option(
    "--threads",
    type=CountList(),
    default="1",
    show_default=True,
    help="Threads for every runtime (PyTorch, ONNX Runtime, TFLite, LCE, the device). A list "
    "(1,2,4) measures the host at the first and the device's LCE latency at each, one row "
    "per count, with a scaling plot in report.md.",
)
@count_option(
    "--samples", default=1000, help="Test samples to score: the first N of RUN_DIR/samples.npz."
)
@choice_option(
    "--target",
    choices=TARGETS,
    default="arm64",
    help="Which LCE flatbuffer: RUN_DIR/model-TARGET.tflite.",
)
@click.option(
    "--device",
    metavar="USER@HOST|adb:SERIAL",
    help=f"Also run the LCE flatbuffer on this device. {device_help()}",
)
@click.option("--port", type=click.IntRange(1, 65535), help="SSH port of the device (SSH only).")
@click.option(
    "--ssh-key",
    type=click.Path(dir_okay=False),
    help="Private key for the device (ssh -i; SSH only); otherwise ssh's own choice.",
)
@click.option(
    "--ssh-option",
    "ssh_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra ssh option (ssh -o; SSH only), repeatable, e.g. UserKnownHostsFile=PATH.",
)
@choice_option(
    "--runner",
    choices=runner_choices(),
    default="auto",
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
    help="Directory on the device for the temporary working directory (removed after); "
    "default: /tmp over SSH, /data/local/tmp over ADB.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=600,
    show_default=True,
    help="Seconds a command on the device may run before it is stopped.",
)
@click.option(
    "--samples-file",
    type=click.Path(dir_okay=False),
    help="For a model file (not a run directory): the samples to score, a .npz with `inputs` "
    "(NCHW float32) and optional `labels`; without it, standard-normal inputs (said in the "
    "report; no accuracy).",
)
@count_option(
    "--device-batch",
    default=64,
    help="With lce_benchmark_model: accuracy on the device runs the batched copy (batch N) "
    "RUN_DIR/model-TARGET-bN.tflite (N = min(this, --samples); written by "
    "`convert --batched-copy N`), one invocation per N samples.",
)
@click.option(
    "--profile",
    is_flag=True,
    help="With --device: where the device's time goes, by PyTorch layer. The device's "
    "batch-1 latency run (lce_benchmark_model, same runs and threads) profiles every op; "
    "each op is traced to the layer it was converted from, and report.md gets the time, "
    "share, op types and binary/float of each layer with a plot. Needs the "
    "lce_benchmark_model runner (auto picks it).",
)
@json_option
@handle_errors
@locks_run("run_dir")
def bench_command(run_dir: str, as_json: bool, **options: Any) -> None:
    """Accuracy, agreement with PyTorch and batch-1 latency of PyTorch, ONNX Runtime, the float
    TFLite model and the LCE flatbuffer of RUN_DIR, on the same test samples; with --device, of
    the LCE flatbuffer on that device too.

    Writes RUN_DIR/bench.json and RUN_DIR/report.md (with plots). Needs samples.npz (from
    `export`); measures each of model.onnx (`export`), model-float.tflite (`convert --format
    tflite`) and model-TARGET.tflite (`convert`) that exists and is current, and lists the
    backends it skipped and why.

    RUN_DIR may also be a model file: an LCE flatbuffer or ONNX model of your own (e.g. what
    `convert_module` wrote). It is benched with its partner when bnnexport made one from the
    other (ONNX Runtime is then the reference), on --samples-file or random inputs, and
    MODEL-bench.json, MODEL-report.md and MODEL-bench_*.png are written next to it.
    """
    from pathlib import Path

    from bnnexport.stages.bench.measure import bench
    from bnnexport.stages.bench.model_file import bench_model_file

    samples_file = options.pop("samples_file")
    if options["profile"] and not options["device"]:
        raise click.BadParameter("profiles the device's run: give --device", param_hint="--profile")
    if options["profile"] and not candidates(options["runner"], profile=True):
        profilers = " or ".join(runner_names(profiles=True))
        raise click.BadParameter(
            f"needs --runner {profilers} (or auto): the {options['runner']} runner has no op "
            "profiler",
            param_hint="--profile",
        )
    progress = not as_json and sys.stderr.isatty()
    target, measure = device_target(options), bench_options(options)
    if Path(run_dir).is_file():
        report = bench_model_file(run_dir, measure, target, samples_file, progress=progress)
    elif samples_file is not None:
        raise click.BadParameter(
            "takes a model file; a run directory is scored on its samples.npz",
            param_hint="--samples-file",
        )
    else:
        report = bench(run_dir, measure, device=target, progress=progress)
    emit(report, as_json)


def bench_options(options: dict[str, Any]) -> BenchOptions:
    """The measuring options of `bench` and `pipeline` as one `BenchOptions`."""
    from bnnexport.stages.bench.options import BenchOptions

    return BenchOptions(
        runs=options["runs"],
        warmup=options["warmup"],
        threads=options["threads"][0],
        scaling_threads=options["threads"][1:],
        samples=options["samples"],
        target=options["target"],
    )


def device_target(options: dict[str, Any]) -> DeviceTarget | None:
    """The --device options of `bench` and `pipeline` as one `DeviceTarget` (None without
    --device)."""
    from bnnexport.stages.bench.options import DeviceTarget

    if not options["device"]:
        return None
    return DeviceTarget(
        address=options["device"],
        port=options["port"],
        ssh_key=options["ssh_key"],
        ssh_options=tuple(options["ssh_options"]),
        runner=options["runner"],
        benchmark_binary=options["benchmark_binary"],
        remote_python=options["remote_python"],
        remote_tmp=options["remote_tmp"],
        timeout=options["timeout"],
        batch=options["device_batch"],
        profile=options.get("profile", False),
    )
