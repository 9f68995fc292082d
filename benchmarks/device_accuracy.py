"""Device accuracy with LCE's real ARM kernels: float and int8 flatbuffers on the emulated aarch64
device against the host's LCE and PyTorch (docs/BENCHMARKS.md "Device accuracy").

For each model: a run (mnist-bnn and the tests' hand-written own and grouped models trained for
--epochs on mnist5k; BinaryNet@32, QuickNet-Small@64 and Bi-Real-Net-18@64 as `bnnexport init`
makes them, on seeded random inputs without labels), exported with --samples test samples,
converted to its float and its int8 (`--float-layers int8`) flatbuffer with a batch-N copy each,
then `bench --device` on the emulated aarch64 device (deploy/emulator.py: Debian arm64 under
qemu-user, needs root) with `--benchmark-binary` (LCE's aarch64 `lce_benchmark_model`) and the
LCE settings each flatbuffer's conversion recorded. The table: top-1 of PyTorch, the host's LCE
and the device; the device's argmax agreement and max |diff| against PyTorch and against the
host's LCE; for int8, how many output steps apart the device and the host are, on how many
samples. Latencies under qemu are not ARM timings and are not reported.

    sudo .venv/bin/python benchmarks/device_accuracy.py --benchmark-binary PATH/lce_benchmark_model
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, emit, log, machine, parser, table

# the tests' hand-written models (tests/support) are `--model module:factory` strings
sys.path.insert(0, str(ROOT / "tests"))

MODELS = {  # name: (how the run is made, model, input shape for init, test samples)
    "mnist-bnn": ("train", "mnist-bnn", None, 500),
    "hand-written": ("train", "support.handwritten_bnn:hand_written_bnn", None, 500),
    "grouped": ("train", "support.own_models:grouped_bnn", None, 500),
    "binarynet@32": ("init", "binarynet", (3, 32, 32), 64),
    "quicknet-small@64": ("init", "quicknet-small", (3, 64, 64), 32),
    "birealnet18@64": ("init", "birealnet18", (3, 64, 64), 32),
}


def prepare(name: str, folder: Path, samples: int | None, epochs: int, batch: int) -> Path:
    """The run of `name`, exported with `samples` test samples (None: its own number) and
    converted to float and int8 with batch-N copies (N = `batch`, at most the samples)."""
    from bnnexport.stages.convert import convert_run
    from bnnexport.stages.export import export_onnx
    from bnnexport.stages.init import init_run
    from bnnexport.stages.train import train
    from bnnexport.training.config import TrainConfig

    how, model, shape, default_samples = MODELS[name]
    samples = samples or default_samples
    batch = min(batch, samples)
    run = folder / name
    if (run / f"model-arm64-int8-b{batch}.tflite").is_file():  # an earlier --keep run's
        log(f"{name}: the run prepared in {run}")
        return run
    shutil.rmtree(run, ignore_errors=True)
    start = time.perf_counter()
    if how == "train":
        own = ":" in model  # a model of one's own: its kernels start as sign(w) (--init-sign)
        train(TrainConfig(model=model, epochs=epochs, batch_size=100, out=str(run), init_sign=own))
    else:
        init_run(model, input_shape=shape, out=run)
    export_onnx(run, samples=samples)
    convert_run(run, target="arm64", batched_copy=batch)
    convert_run(run, target="arm64", float_layers="int8", batched_copy=batch,
                max_accuracy_drop=None)  # fmt: skip
    log(f"{name}: prepared in {time.perf_counter() - start:.0f} s")
    return run


def measure(run: Path, device: Any, binary: str, batch: int) -> dict[str, Any]:
    """`bench --device` of the run on the emulated device: its rows by name and the device's
    identity (what `bench.json` says)."""
    from bnnexport.stages.bench.measure import bench
    from bnnexport.stages.bench.options import BenchOptions, DeviceTarget

    target = DeviceTarget(
        address=device.destination, port=device.port, ssh_key=str(device.key),
        ssh_options=tuple(device.ssh_options), runner="lce_benchmark_model",
        benchmark_binary=binary, remote_tmp=device.remote_tmp, timeout=3600, batch=batch,
    )  # fmt: skip
    start = time.perf_counter()
    report = bench(run, BenchOptions(runs=1, warmup=0, samples=None), device=target)
    log(f"{run.name}: benched in {time.perf_counter() - start:.0f} s")
    rows = {(b.name, b.where == "host"): b for b in report.backends}
    return {"rows": rows, "device": report.device}


def summary(name: str, measured: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per flatbuffer (float, int8) of a model."""
    rows, out = measured["rows"], []
    for flat in ("lce", "lce-int8"):
        device, host = rows.get((flat, False)), rows.get((flat, True))
        versus = rows.get((f"{flat} vs host {flat}", False))
        if device is None or host is None or versus is None:
            continue
        out.append({
            "model": name, "flatbuffer": "int8" if flat.endswith("int8") else "float",
            "lce_settings": device.extra.get("lce_settings"), "samples": device.samples,
            "top1_pytorch": rows[("pytorch", True)].top1, "top1_host": host.top1,
            "top1_device": device.top1,
            "host_agree_vs_pytorch": host.argmax_agreement,
            "agree_vs_pytorch": device.argmax_agreement, "diff_vs_pytorch": device.max_abs_diff,
            "agree_vs_host": versus.argmax_agreement, "diff_vs_host": versus.max_abs_diff,
            "steps_vs_host": versus.extra.get("max_steps"),
            "samples_differing": versus.extra.get("samples_differing"),
            "binarized_dequantized": versus.extra.get("binarized_dequantized"),
            "tool": (device.extra.get("tool") or {}).get("label"),
        })  # fmt: skip
    return out


HEAD = ["model", "flatbuffer", "samples", "top-1 torch", "top-1 host", "top-1 device",
        "host agree vs torch", "agree vs torch", "max|diff| vs torch", "agree vs host",
        "max|diff| vs host", "steps vs host", "samples differing",
        "binarized dequantized"]  # fmt: skip
KEYS = ["model", "flatbuffer", "samples", "top1_pytorch", "top1_host", "top1_device",
        "host_agree_vs_pytorch", "agree_vs_pytorch", "diff_vs_pytorch", "agree_vs_host",
        "diff_vs_host", "steps_vs_host", "samples_differing", "binarized_dequantized"]  # fmt: skip


def arguments(argv: list[str] | None) -> Any:
    """The options, checked (one error line, exit 2, on a bad one)."""
    p = parser(__doc__)
    p.add_argument("--benchmark-binary", default=os.environ.get("BNNEXPORT_LCE_BENCHMARK_AARCH64"),
                   help="LCE's aarch64 lce_benchmark_model (default: "
                        "$BNNEXPORT_LCE_BENCHMARK_AARCH64)")  # fmt: skip
    p.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}"
    )
    p.add_argument("--samples", type=int, help="test samples per model (default: 500 for the "
                   "trained MNIST models, 64 for BinaryNet, 32 for the 64x64 ones)")  # fmt: skip
    p.add_argument("--batch", type=int, default=50, help="the device's batch-N copy")
    p.add_argument("--epochs", type=int, default=1, help="training epochs of the mnist models")
    p.add_argument("--keep", type=Path, help="prepare the runs in this folder and keep them "
                   "(a run an earlier --keep prepared is benched again as it is)")  # fmt: skip
    args = p.parse_args(argv)
    args.names = args.models.split(",")
    if not args.benchmark_binary or not Path(args.benchmark_binary).is_file():
        p.error("--benchmark-binary: give LCE's aarch64 lce_benchmark_model")
    if unknown := [n for n in args.names if n not in MODELS]:
        p.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    from bnnexport.deploy.emulator import default_cache, ensure_rootfs
    from bnnexport.deploy.errors import EmulatorUnavailableError

    try:
        args.rootfs, _ = ensure_rootfs(default_cache(), log)
    except EmulatorUnavailableError as error:
        p.error(f"no emulated aarch64 device: {error}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from bnnexport.deploy.emulator import running_device

    args = arguments(argv)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="device-accuracy-"))
    binary = str(Path(args.benchmark_binary).resolve())
    rows, identity = [], None
    with running_device(folder / "device-session", args.rootfs) as device:
        for name in args.names:
            run = prepare(name, folder, args.samples, args.epochs, args.batch)
            measured = measure(run, device, binary, args.batch)
            identity = measured["device"]
            rows += summary(name, measured)
            log(table(HEAD, [[r[k] for k in KEYS] for r in rows[-2:]]))
    command = " ".join(["benchmarks/device_accuracy.py", *(argv or sys.argv[1:])])
    result = {"machine": machine(), "device": identity, "rows": rows, "command": command}
    tools = sorted({r["tool"] for r in rows if r["tool"]})
    text = (f"{table(HEAD, [[r[k] for k in KEYS] for r in rows])}\n\ntool: {', '.join(tools)}\n"
            f"device: {identity}\nmachine: {result['machine']}")  # fmt: skip
    emit(result, text, args.json)
    return result


if __name__ == "__main__":
    main()
